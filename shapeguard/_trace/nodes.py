"""Graph nodes the batch-first convention named the batch, shown as `nodes`.

Node features `[N, F]` read as `[batch, features]` (`_names/roots.py`). Two structures show
the first axis holds a graph's nodes: its rows picked or summed by a row of an edge index
(`x[src]`, `x.index_select(0, edge_index[0])`, `index_add(0, dst, ...)`: the row as
`_trace/grouping.py` carries it), and a matrix product that contracts it with an `[N, N]`
over itself (a dense GAT's `attention @ Wh`, or its einsum). There the axis is marked to be shown as
`nodes` (`dims.show_as`); what it is to every rule stays the conventional batch.
"""

import torch

from .. import _ops
from .._names import dims as D
from .._names import subscripts
from .._names.shown import NODES, conventional_batch
from .grouping import first_axis_index


def _root(call, tensor, axis: int) -> D.Dim | None:
    """The root dim of `tensor`'s axis `axis` where it is one whole dim the convention alone
    named the batch."""
    meta = call.meta(tensor)
    if meta is None or len(meta.dims) != tensor.dim() or not -tensor.dim() <= axis < tensor.dim():
        return None
    atoms = meta.dims[axis]
    if len(atoms) != 1 or not D.is_whole(atoms[0]):
        return None
    root = atoms[0][0].find()
    return root if conventional_batch(root) else None


def _edge_row(call, index) -> bool:
    meta = call.meta(index)
    return meta is not None and meta.grouped[:1] == ("row",)


def _addressed(call):
    """(tensor, index) where the op addresses the tensor's first axis by an index."""
    op = call.spec.name
    args = call.args
    if op == "__getitem__":
        if len(args) < 2 or not isinstance(args[0], torch.Tensor):
            return None, None
        index = first_axis_index(args[1])
        return (args[0], index) if index is not None else (None, None)
    bound = call.bound()
    source, dim = bound.get("input"), bound.get("dim")
    if not isinstance(source, torch.Tensor) or dim not in (0, -source.dim()):
        return None, None
    return source, bound.get("index")


def note(call) -> None:
    """Mark the node axis the op shows by its structure, if it shows one."""
    op = call.spec.name
    # Ops that pick or write rows of `input` along `dim` by the values of `index` (the
    # table's `addresses`).
    if op == "__getitem__" or call.spec.addresses:
        tensor, index = _addressed(call)
        if isinstance(index, torch.Tensor) and tensor.dim() >= 1 and _edge_row(call, index):
            root = _root(call, tensor, 0)
            if root is not None:
                D.show_as(root, NODES)
    elif op == "einsum":
        _einsum(call)
    elif call.spec.family == _ops.PRODUCT and len(call.args) >= 2:
        # matmul, bmm, mm (a linear's weight has no conventional batch: `_root` says None).
        args = call.args
        a, b = (args[1], args[0]) if call.op in call.spec.reflected else (args[0], args[1])
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            return
        if a.dim() < 2 or b.dim() < 2:
            return
        root = _root(call, b, -2)
        # [N, N] over the contracted axis: rows and columns are the same nodes.
        if root is not None and _root(call, a, -1) is root and _root(call, a, -2) is root:
            D.show_as(root, NODES)


def _einsum(call) -> None:
    """`einsum("hij,hjd->hid", attention, Wh)`: a contracted letter whose axis is a
    conventional batch in one operand and, in the other, both that axis and another."""
    args = call.args
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], list | tuple):
        operands = tuple(operands[0])
    if len(operands) != 2 or not all(isinstance(t, torch.Tensor) for t in operands):
        return
    found = subscripts.product(args[0], [t.dim() for t in operands])
    if found is None:
        return
    (a, b), (sa, sb) = operands, found.equation.specs
    for letter in found.contracted:
        for weights, values, sw, sv in ((a, b, sa, sb), (b, a, sb, sa)):
            root = _root(call, values, sv.index(letter))
            if root is None or _root(call, weights, sw.index(letter)) is not root:
                continue
            if any(_root(call, weights, i) is root for i, c in enumerate(sw) if c != letter):
                D.show_as(root, NODES)
                return
