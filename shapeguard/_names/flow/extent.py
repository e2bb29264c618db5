"""The positions a softmax normalised jointly, carried through views as factors of axes.

A softmax over one axis makes the values along it sum to 1; a view may then split that
axis into factors (Deformable DETR's `heads * levels * points` into three axes) or fold a
factor into another axis (`[batch * heads, ...]`). The factors stay "normalised jointly":
only a sum over all of them is a weighted average. This module notes that extent on the
softmax's output (`Made.normed_over`) and carries it through the ops that keep each
position's value where the extent says: views (which keep the flat row-major index),
transposes and permutes, casts, dropout, masking and elementwise scaling. A product with
values (`weights * sampled`) marks the result `weighted`; `checks/weighted_sum.py` judges
the sum of it.

An extent is positional, never a set of dims: self-attention's scores hold one dim on both
token axes, and a replay copies facts unchanged. Each piece is `(axis, lo, hi)`: the digit
`(i // lo) % (hi // lo)` of an index `i` along that axis, `lo` dividing `hi`.
"""

from ... import _ops
from .. import dims as D
from .base import Made, first_tensor, wrapped_dim
from .views import layout_order

_SOFTMAX = _ops.by_name("softmax")
_DROPOUT, _NAN_TO_NUM = _ops.by_name("dropout"), _ops.by_name("nan_to_num")
_MASKING = (_ops.by_name("masked_fill"), _ops.by_name("where"))
_MUL, _DIV, _ADD = _ops.by_name("mul"), _ops.by_name("div"), _ops.by_name("add")

Piece = tuple[int, int, int]


def carry(call, made: list[Made]) -> list[Made]:
    """`made` with `normed_over` (and `weighted`) set where the output holds weights a
    softmax normalised, or their product with values, at known positions."""
    if len(made) != 1:
        return made
    spec = call.spec
    if spec is _SOFTMAX:
        return [_softmaxed(call, made[0])]
    family = spec.family
    if family not in (_ops.VIEW, _ops.LAYOUT, _ops.SAME, _ops.BINARY):
        return made
    sources = [t for t in call.tensors() if call.meta_of(t).normed_over]
    if len(sources) != 1:
        return made
    source = sources[0]
    meta = call.meta_of(source)
    out_shape = [D.size_of(axis) for axis in made[0].dims]
    weighted = meta.weighted
    if family == _ops.VIEW:
        pieces = _reshaped(meta.normed_over, list(source.shape), out_shape)
    elif family == _ops.LAYOUT:
        order = layout_order(call, source.dim())
        pieces = None if order is None else _permuted(meta.normed_over, order)
    elif family == _ops.SAME:
        same = list(source.shape) == out_shape
        kept = spec.keeps_value or spec is _DROPOUT or spec is _NAN_TO_NUM
        pieces = meta.normed_over if same and kept else None
    else:
        pieces, weighted = _elementwise(call, source, meta, out_shape)
    if not pieces:
        return made
    return [made[0]._replace(normed_over=pieces, weighted=weighted)]


def _softmaxed(call, made: Made) -> Made:
    x = first_tensor(call)
    if x is None or x.dim() < 1:
        return made
    dim = wrapped_dim(call.bound().get("dim"), x.dim())
    size = int(x.shape[dim]) if dim is not None else 1
    if size < 2:
        return made
    return made._replace(normed_over=((dim, 1, size),), weighted=False)


def _elementwise(call, source, meta, out_shape: list[int]):
    """(pieces, weighted) for a binary op of the weights `source`: masking and scaling keep
    them, a product with values varying along the extent weights those values."""
    spec = call.spec
    lead = len(out_shape) - source.dim()
    if lead < 0 or any(
        int(source.shape[axis]) != out_shape[axis + lead] for axis, _, _ in meta.normed_over
    ):
        return None, False  # broadcast along the normalised axes: each value is many
    pieces = tuple((axis + lead, lo, hi) for axis, lo, hi in meta.normed_over)
    if spec in _MASKING:
        kept = source is call.bound().get("input")
        return (pieces if kept else None), meta.weighted
    others = [t for t in call.tensors() if t is not source and t.numel() > 1]
    if not others:
        return (pieces if spec in (_MUL, _DIV, _ADD) else None), meta.weighted
    if spec is not _MUL or meta.weighted or len(others) != 1:
        return None, False
    other = others[0]
    offset = len(out_shape) - other.dim()
    varies = any(
        0 <= axis - offset < other.dim() and other.shape[axis - offset] > 1 for axis, _, _ in pieces
    )
    return (pieces, True) if varies else (pieces, False)


def _permuted(pieces: tuple, order: list[int]) -> tuple | None:
    where = {src: out for out, src in enumerate(order)}
    if any(axis not in where for axis, _, _ in pieces):
        return None
    return _canonical([(where[axis], lo, hi) for axis, lo, hi in pieces])


def _reshaped(pieces: tuple, src: list[int], dst: list[int]) -> tuple | None:
    """The pieces of a view from shape `src` to `dst` (the flat index kept); None when a
    piece is cut where no digit of the new axes lines up with it."""
    if _inner(src, -1) != _inner(dst, -1):
        return None  # a complex view: the elements are not the same
    flat = []
    for axis, lo, hi in pieces:
        if axis >= len(src):
            return None
        inner = _inner(src, axis)
        flat.append((inner * lo, inner * hi))
    out: list[Piece] = []
    for axis, size in enumerate(dst):
        inner = _inner(dst, axis)
        for lo, hi in flat:
            a, b = max(lo, inner), min(hi, inner * size)
            if a >= b:
                continue
            if a % inner or b % a:
                return None
            out.append((axis, a // inner, b // inner))
    covered = 1
    for _, lo, hi in out:
        covered *= hi // lo
    total = 1
    for lo, hi in flat:
        total *= hi // lo
    return _canonical(out) if covered == total else None


def _inner(shape: list[int], axis: int) -> int:
    n = 1
    for size in shape[axis + 1 :]:
        n *= int(size)
    return n


def _canonical(pieces: list[Piece]) -> tuple:
    """Pieces sorted, adjacent digits of one axis merged."""
    out: list[Piece] = []
    for axis, lo, hi in sorted(pieces, key=lambda p: (p[0], -p[1])):
        if out and out[-1][0] == axis and out[-1][1] == hi:
            out[-1] = (axis, lo, out[-1][2])
        else:
            out.append((axis, lo, hi))
    return tuple(out)
