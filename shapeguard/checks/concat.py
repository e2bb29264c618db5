"""Concatenations that join tensors of different positions along their heads.

Two streams attended jointly (SD3's and Flux's text and image tokens) are concatenated
along their tokens: `torch.cat((q_text, q_image), dim=1)` on `[batch, tokens, heads, d_k]`.
Concatenated along the heads instead, the call fails while the two lengths differ, and runs
where they coincide: every position then holds the heads of a text token and of an image
token, and attention runs within each stream, over positions that mean two things.

`cat_axis` stands on structure alone: in every operand the joined axis is a factor of a
projection's features (heads, cut from a Linear's output by a view), and another axis that
the concatenation lines up holds positions of different origin in two operands, those of
one established by structure (a conv's feature map, an attention's keys). A concatenation
of heads of the same tokens (two heads groups of one input), of a cache and new keys along
the sequence, or of text and image along their tokens gives nothing.
"""

from collections.abc import Iterator

from .. import _ops, _source
from .._errors import Violation
from .._names import dims as D
from .._values import is_tensor
from . import WARNING, rule
from ._view import CallView


@rule(_ops.by_name("cat"), kinds={"cat_axis": WARNING})
def cat_of_other_positions(call: CallView) -> Iterator[Violation]:
    """Heads of tensors whose positions differ concatenated where their tokens belong."""
    bound = call.bound()
    tensors = bound.get("tensors")
    dim = bound.get("dim", 0)
    if not isinstance(tensors, list | tuple) or len(tensors) < 2 or not isinstance(dim, int):
        return
    if not all(is_tensor(t) for t in tensors):
        return
    ndim = tensors[0].dim()
    if ndim < 3 or any(t.dim() != ndim for t in tensors) or not -ndim <= dim < ndim:
        return
    d = dim % ndim
    shapes = [tuple(t.shape) for t in tensors]
    if any(s[:d] + s[d + 1 :] != shapes[0][:d] + shapes[0][d + 1 :] for s in shapes):
        return  # torch refuses it, and says which sizes differ
    axes = [call.dims(t) for t in tensors]
    if not all(_head_factor(a[d]) for a in axes):
        return
    for e in range(ndim):
        if e == d or shapes[0][e] == 1:
            continue
        pair = _other_positions([a[e] for a in axes])
        if pair is not None:
            yield _violation(call, tensors, d, e, pair)
            return


def _head_factor(axis) -> bool:
    """The axis is a factor of a projection's features, cut by a view (heads, d_k): not
    whole features, which concatenate two inputs' channels on the same positions."""
    return bool(axis) and all(
        D.established_kind(a) == D.FEATURE and not D.is_whole(a) for a in axis
    )


def _other_positions(parts) -> tuple[int, int] | None:
    """Two operands whose axis holds positions of different origin, one of them positions
    by structure: (the structural one, the other)."""
    for i, axis in enumerate(parts):
        if not axis or not all(D.established_kind(a) == D.TOKEN for a in axis):
            continue
        roots = {id(r) for r in D.roots_of(axis)}
        for k, other in enumerate(parts):
            if k == i or D.kind_of(other) != D.TOKEN:
                continue
            if roots.isdisjoint(id(r) for r in D.roots_of(other)):
                return i, k
    return None


def _violation(call, tensors, d: int, e: int, pair: tuple[int, int]) -> Violation:
    items = _source.sequence_items(call.source_text(0) or "") or []
    labels = items if len(items) == len(tensors) else [f"tensors[{i}]" for i in range(len(tensors))]
    shown, other = pair
    axes = [call.dims(t) for t in tensors]
    joined = D.known_name(axes[0][d]) or f"axis {d}"
    first, second = sorted((shown, other))
    positions = [D.known_name(axes[i][e]) or f"axis {e}" for i in (first, second)]
    size = int(tensors[0].shape[e])
    listed = ", ".join(labels)
    relation = (
        f"torch.cat(({listed}), dim={d}) joins along {joined} (axis {d}), but axis {e} holds "
        f"{positions[0]} in {labels[first]} and {positions[1]} in {labels[second]}: each "
        f"position would hold the heads of two different tokens, and only the coinciding "
        f"sizes ({size}) let it run"
    )
    hint = f"concatenate along the tokens: torch.cat(({listed}), dim={e})"
    operands = tuple(call.operand(label, t) for label, t in zip(labels, tensors, strict=True))
    return Violation("cat_axis", relation, operands, hint, severity="warning")
