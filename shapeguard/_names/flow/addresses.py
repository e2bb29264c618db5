"""Indices that are positions along one of their own axes: an argsort's or a sort's.

`torch.argsort(noise, dim=1)` holds, along each row, positions along axis 1 of `noise`: the
explicit `dim=` says which axis its values address, whatever the sizes. The output keeps
that axis where it was, so the fact is a position (`Made.addresses`): the axis of this tensor
along which the values are positions. It is carried by the ops that keep each value where
its row is: slices (`ids[:, :keep]`), `unsqueeze`, `repeat`, `expand`, copies and casts,
and moved by `transpose` and `permute`; anything else drops it, and nothing is claimed.
`checks/layout.py` reads it at a gather that uses the values along another axis.
"""

from ... import _ops
from .base import Made, first_tensor, wrapped_dim

_SORTS = (_ops.by_name("argsort"), _ops.by_name("sort"))
_GETITEM, _UNSQUEEZE = _ops.by_name("__getitem__"), _ops.by_name("unsqueeze")
_GROWS = (_ops.by_name("repeat"), _ops.by_name("expand"))
_LAYOUTS = (_ops.by_name("transpose"), _ops.by_name("permute"))
NONE = -1


def carry(call, made: list[Made]) -> list[Made]:
    """`made` with `addresses` set on an argsort's (a sort's indices) output, or kept where an
    op of the one input whose values are ranks keeps them along a known axis."""
    spec = call.spec
    if spec in _SORTS:
        return _sorted(call, made)
    if len(made) != 1:
        return made
    carried = spec is _GETITEM or spec is _UNSQUEEZE or spec in _GROWS or spec in _LAYOUTS
    if not carried and not (spec.family == _ops.SAME and spec.keeps_value):
        return made
    x = first_tensor(call)
    if x is None:
        return made
    k = call.meta_of(x).addresses
    if k == NONE:
        return made
    moved = _moved(call, x, k, len(made[0].dims))
    return [made[0]._replace(addresses=moved)] if moved != NONE else made


def _sorted(call, made: list[Made]) -> list[Made]:
    x = first_tensor(call)
    if x is None or not x.dim():
        return made
    dim = call.bound().get("dim", -1)
    k = wrapped_dim(-1 if dim is None else dim, x.dim())
    if k is None:
        return made
    # argsort's one output; sort's indices are its second.
    at = len(made) - 1
    return [m._replace(addresses=k) if i == at else m for i, m in enumerate(made)]


def _moved(call, x, k: int, ndim: int) -> int:
    """Where axis `k` of the input is in the output (NONE where the op may have moved it
    somewhere this does not follow)."""
    spec, args = call.spec, call.args
    if spec.family == _ops.SAME:
        return k if ndim == x.dim() else NONE
    if spec is _UNSQUEEZE:
        d = wrapped_dim(call.bound().get("dim"), ndim)
        return NONE if d is None else k + (d <= k)
    if spec in _GROWS:
        return k + ndim - x.dim()  # new axes are leading ones
    if spec is _GETITEM:
        key = args[1] if len(args) > 1 else None
        items = key if isinstance(key, tuple) else (key,)
        # Slices only (and Ellipsis last): each axis stays where it was.
        if not all(isinstance(i, slice) for i in items) or ndim != x.dim():
            return NONE
        return k
    if spec is _LAYOUTS[0]:
        a, b = (wrapped_dim(d, x.dim()) for d in args[1:3]) if len(args) >= 3 else (None, None)
        if a is None or b is None:
            return NONE
        return b if k == a else a if k == b else k
    order = args[1:]
    if len(order) == 1 and isinstance(order[0], tuple | list):
        order = tuple(order[0])
    wrapped = [wrapped_dim(d, x.dim()) for d in order]
    return wrapped.index(k) if k in wrapped else NONE
