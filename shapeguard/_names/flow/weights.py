"""Attention weights: the side of them a softmax made sum to 1, carried to the product.

Each output of attention is a weighted sum over keys whose weights sum to 1 over those
keys, so the axis a softmax normalises must be the axis the product with V then sums
over (`checks/aggregation.py`). Which side of the weights an axis is, the queries' ("q")
or the keys' ("k"), is what the query-key product said: its q/k tags, or, where the two
are different axes (cross-attention), the roots it marked as rows and columns. A dense
graph attention has no product: its scores are one node axis broadcast against itself
(`Wh @ a1 + (Wh @ a2).T`), and the softmax is what tells its two axes apart; its output
is tagged "k" along the axis it normalised and "q" along the other.

The side is noted on the softmax's output (`Made.normed`) and carried by the ops that
keep the weights what they are: views, copies, casts, dropout, masking, adding a number
and scaling by what is one value along both sides or along the normalised one. A product
or division by what varies along one side only (`attn / attn.sum(dim=-1, keepdim=True)`)
may renormalise along the other, and a subtraction or any other op makes new values:
after them nothing is noted, and nothing is claimed.
"""

from ... import _ops
from .. import dims as D
from .base import Made, first_tensor, wrapped_dim

_SOFTMAX = _ops.by_name("softmax")
_DROPOUT, _NAN_TO_NUM = _ops.by_name("dropout"), _ops.by_name("nan_to_num")
_MASKING = (_ops.by_name("masked_fill"), _ops.by_name("where"))
_SCALING = (_ops.by_name("mul"), _ops.by_name("div"))
_ADD = _ops.by_name("add")
_ARRANGING = (_ops.VIEW, _ops.LAYOUT)
SIDES = ("q", "k")


def side_of(meta, i: int) -> str | None:
    """ "q" or "k": which side of a query-key product axis `i` of `meta`'s tensor is, from
    its tag, else from the roots the product marked; None when neither says."""
    tag = meta.tags[i] if i < len(meta.tags) else None
    if tag == "q" or tag == "k":
        return tag
    roots = D.roots_of(meta.dims[i])
    if not roots:
        return None
    if all(r.q_side and not r.k_side for r in roots):
        return "q"
    if all(r.k_side and not r.q_side for r in roots):
        return "k"
    return None


def twin_of(meta, i: int) -> int | None:
    """The one other axis of `meta`'s tensor with the same factors as axis `i` (an axis
    broadcast against itself), or None."""
    atoms = D.normalize(meta.dims[i])
    if not atoms:
        return None
    twins = [j for j, axis in enumerate(meta.dims) if j != i and D.normalize(axis) == atoms]
    return twins[0] if len(twins) == 1 else None


def carry(call, made: list[Made]) -> list[Made]:
    """`made` (the call's outputs' axes) with `normed` set where the output is attention
    weights: a softmax's, or an op's that keeps them so."""
    spec = call.spec
    if len(made) != 1:
        return made
    if spec is _SOFTMAX:
        return [_softmaxed(call, made[0])]
    family = spec.family
    if family != _ops.BINARY and family != _ops.SAME and family not in _ARRANGING:
        return made
    # A plain loop: this runs for most ops, and a generator is one more tracked object.
    for source in call.tensors():
        meta = call.meta_of(source)
        if meta.normed:
            break
    else:
        return made
    kept = family in _ARRANGING or (
        spec.keeps_value or spec is _DROPOUT or spec is _NAN_TO_NUM
        if family == _ops.SAME
        else _keeps_sums(call, source, meta)
    )
    return [made[0]._replace(normed=meta.normed)] if kept else made


def _softmaxed(call, made: Made) -> Made:
    x = first_tensor(call)
    if x is None or x.dim() < 2:
        return made
    dim = wrapped_dim(call.bound().get("dim"), x.dim())
    if dim is None:
        return made
    meta = call.meta_of(x)
    if meta.role == "scores":
        return made._replace(normed=side_of(meta, dim) or "")
    twin = twin_of(meta, dim)
    if twin is None or any(meta.tags):
        return made
    tags: list[str | None] = [None] * x.dim()
    tags[dim], tags[twin] = "k", "q"
    return made._replace(tags=tuple(tags), normed="k")


def _keeps_sums(call, source, meta) -> bool:
    """Whether an elementwise op of the weights `source` keeps them summing to 1 along
    the side they did (up to a mask, a number added, a scale)."""
    spec = call.spec
    if spec in _MASKING:
        return source is call.bound().get("input")  # the weights are the values masked
    others = [t for t in call.tensors() if t is not source and t.numel() > 1]
    if spec is _ADD:
        return not others
    if spec not in _SCALING or call.op in spec.reflected:
        return False
    if spec is _SCALING[1] and source is not first_tensor(call):
        return False  # divided by the weights
    ndim = source.dim()
    for other in others:
        lead = ndim - other.dim()
        if lead < 0:
            return False
        varies = {
            side_of(meta, k)
            for k in range(lead, ndim)
            if other.shape[k - lead] > 1 and source.shape[k] > 1
        }
        sides = [side for side in SIDES if side in varies]
        # One value per query (or per key) rescales each row (column): that may be a
        # renormalisation along the other side, unless it is the side they sum to 1 along.
        if len(sides) == 1 and ("k" if sides[0] == "q" else "q") != meta.normed:
            return False
    return True
