"""What every axis rule shares: the result type, the registry, small helpers."""

from collections.abc import Callable
from typing import NamedTuple

from ... import _ops
from ..._values import is_tensor
from .. import dims as D
from ..dims import STRUCTURE, Axis


class Made(NamedTuple):
    dims: tuple[Axis, ...]
    tags: tuple[str | None, ...] = ()
    role: str | None = None
    rotary: bool = False
    param: bool = False
    laid_out: bool = False  # a transpose or permute chose this axis order
    normed: str = ""  # attention weights: the side they sum to 1 along (`weights`)
    addresses: int = -1  # indices: the axis along which the values are positions (`addresses`)
    normed_over: tuple = ()  # positions a softmax normalised jointly (`extent`)
    weighted: bool = False  # those weights times values (`extent`)


Rule = Callable[..., list[Made] | None]
_RULES: dict[str, Rule] = {}


def propagates(*families: str):
    def register(rule: Rule) -> Rule:
        for family in families:
            if family in _RULES:
                raise RuntimeError(f"axis rule for {family!r} registered twice")
            _RULES[family] = rule
        return rule

    return register


def rule_for(family: str) -> Rule | None:
    """The axis rule registered for an op family, or None (the caller falls back)."""
    return _RULES.get(family)


# -- shared helpers ---------------------------------------------------------------------------
def wrapped_dim(d, ndim: int) -> int | None:
    """A `dim` argument as a position in `0..ndim-1` (negative ones wrap), or None when it is
    not an int (absent, a tuple, a name)."""
    if isinstance(d, int) and not isinstance(d, bool) and ndim:
        return d % ndim
    return None


def first_tensor(call):
    """The op's first tensor argument, positional before keyword; None when it has none."""
    for a in call.args:
        if is_tensor(a):
            return a
    for v in call.kwargs.values():
        if is_tensor(v):
            return v
    return None


# Families whose unknown members usually keep their input's axes (an activation, an
# elementwise op the table does not list); any other op's output is new.
_SHAPE_KEEPING = frozenset({_ops.OTHER, _ops.SAME, _ops.BINARY})


def fallback_axes(call, out) -> Made:
    """For an op of an elementwise-like family, the axes of its input of the output's
    shape, when exactly one input has it; else new axes (never a guess from a size that
    happens to coincide, as a product's output with its input's)."""
    shape = tuple(out.shape)
    if call.spec.family in _SHAPE_KEEPING:
        same = [t for t in call.tensors() if tuple(t.shape) == shape]
        metas = {id(m): m for m in (call.meta_of(t) for t in same)}
        if len(metas) == 1:
            m = next(iter(metas.values()))
            return Made(m.dims, m.tags, m.role if call.spec.keeps_label else None, m.rotary)
    return Made(D.fresh_axes(shape, origin=call.op))


def tag_at(meta, i: int):
    """The q/k tag of axis `i` of a meta, or None (a meta keeps no tags when it has none)."""
    return meta.tags[i] if i < len(meta.tags) else None


def tags_if_any(tags: list) -> tuple:
    """Tags as a `Made` holds them: the tuple when any axis is tagged, else `()`."""
    return tuple(tags) if any(tags) else ()


def claim_axis(axis: Axis, kind: str, name: str | None = None, side: str = "") -> None:
    """What attention says of an axis; never against a kind a parameter already gave it."""
    if not axis:
        return
    # All factors or none: a folded [batch * heads] axis whose heads refuse to be positions
    # must not leave its batch claimed as positions (SpeechT5's relative bias product).
    if not all(D.accepts_kind(atom[0], kind, STRUCTURE) for atom in axis):
        return
    for atom in axis:
        D.claim_kind(atom[0], kind, STRUCTURE)
    if name is not None and len(axis) == 1:
        D.claim_part(axis[0], name, STRUCTURE)
    if side in ("q", "k"):
        for atom in axis:
            D.set_side(atom[0].find(), q=side == "q", k=side == "k")
