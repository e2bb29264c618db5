"""Where an input's conventional batch axis meets itself: a matrix product contracts it.

A dense graph attention reads node features [nodes, features], and the batch-first
convention names the nodes the batch; but the scores [nodes, nodes] are built over that
axis, and `attn @ Wh` sums over it: every output row reads every node. An axis a product
contracts holds no independent examples, so the batch probes do not take it as a batch
(issue 32's dense GAT failed batch independence by design). Only an axis whose batch kind
rests on the convention alone yields: a structural batch (a conv's N, an attention op's
batch) that a product contracts is a bug for the probes to find.
"""

import torch

from .. import _ops
from .._names import dims as D

# Products that contract the first operand's last axis with the second's second-to-last
# (torch's matmul rule); einsum and linear say theirs otherwise.
_MATRIX_PRODUCTS = (_ops.by_name("matmul"), _ops.by_name("bmm"), _ops.by_name("mm"))


def note_contracted(contracted: list, session, op: str, args, where) -> None:
    """Append (the dim, where) for each whole dim a matrix product contracts; `where()`
    names the op."""
    declared = _ops.declared(op)
    if declared not in _MATRIX_PRODUCTS or len(args) < 2:
        return
    a, b = (args[1], args[0]) if op in declared.reflected else (args[0], args[1])
    for t, axis in ((a, -1), (b, -2)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            continue
        meta = session.metas.get(t)
        if meta is None or len(meta.dims) != t.dim() or len(meta.dims[axis]) != 1:
            continue
        dim = meta.dims[axis][0][0].find()
        if not any(seen is dim for seen, _ in contracted):
            contracted.append((dim, where()))


def conventional_batch_roots(found, dims, kinds, batch_axis):
    """(path, tensor, axis, root) for each input whose batch axis is one dim whose batch kind
    rests on the batch-first convention alone (a structural batch is never yielded)."""
    for path, t in found:
        axis = batch_axis[path]
        if axis is None or kinds[path] not in ("ids", "data"):
            continue
        atoms = dims[path][axis]
        if len(atoms) != 1 or D.established_kind(atoms[0]) == D.BATCH:
            continue
        yield path, t, axis, atoms[0][0].find()


def contracted_batch(found, dims, kinds, names, batch_axis, watch) -> str:
    """Why an input's batch axis, named by the batch-first convention only, holds no
    independent examples: a matrix product contracts it ("" where none does)."""
    for path, t, axis, root in conventional_batch_roots(found, dims, kinds, batch_axis):
        for dim, where in watch.contracted:
            if dim.find() is root:
                name = names.get(path) or "input"
                return (
                    f"axis {axis} of {name} {list(t.shape)} is contracted by {where}: the "
                    "examples are not independent along it (the batch-first convention "
                    "alone named it the batch)"
                )
    return ""
