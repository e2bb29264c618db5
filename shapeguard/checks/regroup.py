"""What a view or reshape does to the axes: data moved across axes of different origin.

A view keeps memory order, so it can only split an axis into factors or merge
neighbours whole. Read through provenance (`_names`), these are the ways it moves
data where it should not:

- it cuts across a token axis (batch or seq): heads carved out of the sequence,
  heads merged back before the transpose, batch folded into the sequence, a patch
  grid flattened without its permute, a window partition without its permute
  (`view_mixes_axes`);
- it entangles two axes whose factors do not line up (a relative-bias table
  viewed in place of a permute);
- it merges a position with a factor of the features into one axis, while other
  axes remain (`[heads, seq, d_k] -> [seq, heads * d_k]` read as `[seq, d_model]`);
- it unfolds `[batch * heads]` in the other order than it was folded, so examples
  (or, where the batch stays outermost, the other factors of each example) trade their
  data (`batch_mixing`);
- where sizes coincide and none of this shows in the shapes, the user's own names
  for the target sizes (`view(B, self.n_heads, S, d_k)`) contradict what lands there.

A finding is a claim, so each of these fires only on established evidence (design.md,
"What the view rules prove"): the kinds it relies on known from a parameter, an op's
structure or a contract (`dims.established_kind`), or the user's own declarations in the
view's sizes (a size read from a tensor's shape, a declared attribute such as
`self.n_heads`) contradicted by what the view does. The usual layout of a model's input
(a convention) names axes in messages, and is never the only reason to fire.

What a view may do without a finding: regroup positions among themselves (a relative
shift, chunks, windows with their permute), fold positions or features into the batch
(`[batch * chunks, chunk, ...]`, `[batch * channels * rows, ...]`), and flatten to rows
(`[batch * seq * heads, d_k]`, `[batch, seq * 2, C]`): positions major, a factor of the
features minor, whole features after it.
"""

from collections.abc import Iterator
from math import prod

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from . import WARNING, is_tensor, rule
from ._regroup_merges import Merges
from ._regroup_names import NamedOtherwise
from ._regroup_tokens import TokenCuts
from ._regroup_view import carve_hint
from ._view import CallView
from ._view_shape import target_shape, view_compatible


class RegroupView(TokenCuts, Merges, NamedOtherwise):
    """One view under examination, with every finding `regroup` looks for."""


@rule(
    _ops.by_name("view"),
    _ops.by_name("reshape"),
    kinds={"view_mixes_axes": WARNING, "batch_mixing": WARNING},
    order=1,
)
def regroup(call: CallView) -> Iterator[Violation]:
    args = call.args
    if not args or not is_tensor(args[0]):
        return
    x = args[0]
    target = target_shape(args, call.kwargs)
    if target is None:
        return
    shape = tuple(int(s) for s in x.shape)
    resolved = _axes.resolve_view_shape(prod(shape), target)
    if resolved is None:
        return  # view_numel
    if (
        call.op == "view"
        and not x.is_contiguous()
        and not view_compatible(shape, tuple(x.stride()), resolved)
    ):
        return  # noncontiguous_view
    groups = _axes.view_groups(shape, resolved)
    if groups is None:
        return
    view = RegroupView(call, x, target, shape, resolved, groups)
    for finding in (
        view.batch_unfold,
        view.straddle,
        view.entangled,
        view.merged_kinds,
        view.named_otherwise,
    ):
        violation = finding()
        if violation is not None:
            yield violation
            return


def noncontiguous_hint(call: CallView, x, sizes, shape, resolved, label: str) -> str:
    """The hint for a `view` torch refuses for its strides: `.reshape` only where the view
    moves no data across axes (a merge or split of whole neighbours); where it would, the
    reshape runs and computes the wrong thing, so the hint is the view the code meant."""
    groups = _axes.view_groups(shape, resolved)
    generic = f"use {label}.contiguous().view(...) or {label}.reshape(...)"
    if groups is None:
        return generic
    view = RegroupView(call, x, sizes, shape, resolved, groups)
    moved = view.moves_data()
    if moved is None:
        return generic
    real_i, real_j, t = moved
    if t is not None and view.carves(real_i, real_j, t):
        return carve_hint(label, shape, real_i, call.declared(), sizes, view.count(real_j))
    return f"{label}.reshape(...) would run and move data across axes: " + view.reorder_hint(
        real_i, real_j
    )
