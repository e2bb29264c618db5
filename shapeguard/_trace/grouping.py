"""Per-group normalisation over an edge index, as its structure shows it (`Facts.grouped`).

Graph attention (GAT) normalises its edge scores within the edges that share a node and
sums the weighted messages into nodes: `torch_geometric.utils.softmax(src, index)` scatters
the sums by `index` and reads them back by the same `index`, then divides; the aggregation
scatters by an index of its own. Both indices are usually rows of one `edge_index`. What a
tensor is on that path is one tuple, carried by the ops that keep it:

- `("row", slot, position, label)`: an integer tensor that is row `position` of the 2-D
  tensor whose meta has `slot` (`edge_index[0]`, `row, col = edge_index`), or a view or
  expansion of one (PyG broadcasts its index before `scatter_add_`; `group[:, None]`);
- `("sums", row)`: a sum scattered by that row (`index_add(_)`, `scatter_add(_)`,
  `scatter_reduce(sum)`), also plus a number (PyG adds 1e-16) or clamped;
- `("denominators", row)`: those sums read back by the same row (`index_select`, `sums[row]`,
  `gather` along the first axis), also plus a number or clamped;
- `("normalised", row)`: an exp divided by them (a softmax), and what keeps that: views
  (`alpha[..., None]` too), dropout, a product with messages that carry no grouping.

The rule on the aggregation is `checks/graph.py`. Nothing here guesses: an index whose
origin is not a row of a known tensor carries nothing, so no claim follows.
"""

import torch

from .. import _ops

_NOTHING: tuple = ()


def _grouped(call, value) -> tuple:
    meta = call.meta(value)
    return meta.grouped if meta is not None else _NOTHING


def _row_of(call, base, position) -> tuple:
    """Row `position` of an integer 2-D tensor whose meta the session holds."""
    if not isinstance(position, int) or isinstance(position, bool):
        return _NOTHING
    if base.dim() != 2 or base.is_floating_point() or base.is_complex():
        return _NOTHING
    rows = int(base.shape[0])
    if not -rows <= position < rows:
        return _NOTHING  # torch raises; no row
    meta = call.meta(base)
    if meta is None or meta.slot == 0 or base.dtype == torch.bool:
        return _NOTHING
    return ("row", meta.slot, position % rows, meta.label or "")


def _selected_row(call) -> tuple:
    """`t[i]`, `t[i, :]`, `t.select(0, i)`: a row of `t`."""
    args = call.args
    if len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return _NOTHING
    if call.spec.name == "select":
        bound = call.bound()
        if bound.get("dim") not in (0, -2):
            return _NOTHING
        return _row_of(call, args[0], bound.get("index"))
    key = args[1]
    if isinstance(key, tuple):
        rest = key[1:]
        if not all(isinstance(s, slice) and s == slice(None) for s in rest):
            return _NOTHING
        key = key[0] if key else None
    return _row_of(call, args[0], key)


def _reduction(call) -> object:
    """`scatter_reduce`'s reduce, by keyword or by position (after input, dim, index, src)."""
    args = call.args
    return call.kwargs.get("reduce", args[4] if len(args) > 4 else None)


def _scattered(call) -> tuple:
    """A sum scattered by a row: the row it was grouped by, or nothing."""
    bound = call.bound()
    if call.spec.name == "scatter_reduce" and _reduction(call) != "sum":
        return _NOTHING
    index = bound.get("index")
    grouped = _grouped(call, index) if isinstance(index, torch.Tensor) else _NOTHING
    return ("sums", grouped) if grouped[:1] == ("row",) else _NOTHING


def _whole(key) -> bool:
    """An indexing key that keeps every element where it is, adding axes at most:
    `t[:, None]`, `t[..., None]`, `t[:]`."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(
        p is None or p is Ellipsis or (isinstance(p, slice) and p == slice(None)) for p in parts
    )


def first_axis_index(key):
    """The index tensor of an indexing key that addresses the first axis by it and keeps
    the others whole (`t[i]`, `t[i, :]`, `t[i, ...]`), or None."""
    if isinstance(key, tuple) and key and _whole(key[1:]):
        key = key[0]
    return key if isinstance(key, torch.Tensor) else None


def _read_back(call, source, index) -> tuple:
    """Sums read back by the row that scattered them: each edge's denominator."""
    sums = _grouped(call, source)
    if (
        sums[:1] == ("sums",)
        and isinstance(index, torch.Tensor)
        and _grouped(call, index) == sums[1]
    ):
        return ("denominators", sums[1])
    return _NOTHING


def _exp(call, value) -> bool:
    """Made by exp: the numerator of a softmax. Other sums divided back (a random walk's
    `edge_weight / deg[row]`, which may go either way by design) carry no claim."""
    meta = call.meta(value)
    return meta is not None and meta.op.rstrip("_") == "exp"


def _binary(call, args) -> tuple:
    tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
    op = call.spec.name
    if len(tensors) == 1:
        kept = _grouped(call, tensors[0])
        # sums + eps are still the sums; weights times a number are still proportional.
        if op == "add" and kept[:1] in (("sums",), ("denominators",)):
            return kept
        if op == "mul" and kept[:1] == ("normalised",):
            return kept
        return _NOTHING
    if len(tensors) != 2:
        return _NOTHING
    first, second = _grouped(call, tensors[0]), _grouped(call, tensors[1])
    if op == "div" and second[:1] == ("denominators",) and not first and _exp(call, tensors[0]):
        return ("normalised", second[1])
    if op == "mul":
        # Weights times messages: each edge's message scaled by its weight.
        if first[:1] == ("normalised",) and not second:
            return first
        if second[:1] == ("normalised",) and not first:
            return second
    return _NOTHING


def carried(call, in_metas: list, count: int) -> tuple:
    """What each of the op's `count` outputs is on the path above (a tuple per output,
    empty where nothing), read from the op and its inputs' metas."""
    op = call.spec.name
    spec = call.spec
    args = call.args
    if op == "unbind" and args and isinstance(args[0], torch.Tensor):
        if call.bound().get("dim", 0) not in (0, -2):
            return _NOTHING
        return tuple(_row_of(call, args[0], k) for k in range(count))
    if op == "select" or op == "__getitem__":
        index = first_axis_index(args[1]) if op == "__getitem__" and len(args) >= 2 else None
        if index is not None:
            return (_read_back(call, args[0], index),)
        row = _selected_row(call)
        if row:
            return (row,)
    if not any(m is not None and m.grouped for m in in_metas):
        return _NOTHING
    if op == "__getitem__" and len(args) >= 2 and _whole(args[1]):
        return (_grouped(call, args[0]),)
    if op == "index_select":
        bound = call.bound()
        return (_read_back(call, bound.get("input"), bound.get("index")),)
    if op == "gather":
        # Along the first axis only: there the index's row addresses the groups.
        bound = call.bound()
        source = bound.get("input")
        first = isinstance(source, torch.Tensor) and bound.get("dim") in (0, -source.dim())
        return (_read_back(call, source, bound.get("index")) if first else _NOTHING,)
    if op == "clamp" and args and _grouped(call, args[0])[:1] in (("sums",), ("denominators",)):
        return (_grouped(call, args[0]),)  # a floor against empty groups: still the sums
    if spec.addresses and spec.family == _ops.OTHER:
        if op == "scatter_add" or op == "index_add" or op == "scatter_reduce":
            return (_scattered(call),)
        return _NOTHING
    if spec.family == _ops.BINARY:
        return (_binary(call, args),)
    # Views, expansions, detach, contiguous and dropout keep what their one input is.
    keeps = spec.family in (_ops.VIEW, _ops.GROW) and spec.keeps_value
    if keeps or op == "dropout" or (spec.family == _ops.SAME and spec.keeps_value):
        return (_grouped(call, args[0]) if args else _NOTHING,)
    return _NOTHING
