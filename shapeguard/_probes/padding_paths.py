"""Where changed padded positions reach the real tokens: through attention, or not.

Key-padding invariance says that what the padded positions hold never reaches the real
tokens' outputs. A padding mask can only promise that for the attention it is applied
to: a module that also mixes positions outside attention (a convolution along the
positions, a recurrence, a pooling or an index of a position) carries the padded values
to the real tokens by design, whatever the mask does.

The probe's two runs (the padded positions as given, then changed) are compared op by
op, each op's output on the real positions only (every axis of the probed tokens cut to
them; a tensor without such an axis, a pooled vector, whole). An op whose output differs
there while none of its operands does is an **entry**: the padded values reach real
positions through it. Each difference carries the entries it descends from, and only
entries that reach the compared outputs count. An entry through attention (SDPA, flash
attention, an attention module, a softmax, or the product of softmax weights with V) is
the mask failing to hide the keys: the probe's failure stands. Where every entry that
reaches the outputs is another op, the property is not one the module's structure
promises, and the probe is inconclusive, naming the op and its line.
"""

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .edits import take
from .locate import seq_dims
from .subject import Subject
from .tree import leaves, op_tensors, pick
from .watch import describe_event

_SOFTMAX = _ops.spellings_where(step="softmax")
_ATTENTION = (_ops.ATTENTION, _ops.FLASH, _ops.COMPOSITE)
# Ops that only move values (views, cuts, joins, copies along an axis, layouts) or act
# elementwise (a pooled vector broadcast back over the positions): carried values they
# lay back onto positions were mixed where they were taken off them.
_MOVES = (
    _ops.VIEW,
    _ops.INDEX,
    _ops.JOIN,
    _ops.PART,
    _ops.GROW,
    _ops.LAYOUT,
    _ops.SAME,
    _ops.BINARY,
)
# What an op of these families does to the positions, for the reason's words.
_WHAT = {
    _ops.CONV: "a convolution along the positions",
    _ops.INDEX: "an index or gather of positions",
    _ops.REDUCE: "a reduction over the positions",
    _ops.VIEW: "a view that regroups the positions",
    _ops.JOIN: "a join along the positions",
}


@dataclass(frozen=True, slots=True)
class Entry:
    """An op through which the padded values first reach real positions."""

    where: str  # "conv1d at modeling_convbert.py:123 (encoder.layer.0...)"
    op: str
    attention: bool


@dataclass(frozen=True, slots=True)
class Paths:
    """The entries that reach the compared outputs (in op order)."""

    entries: tuple[Entry, ...]

    @property
    def through_attention(self) -> Entry | None:
        return next((e for e in self.entries if e.attention), None)

    @property
    def elsewhere(self) -> Entry | None:
        """The first entry, when none of them is an attention op."""
        if not self.entries or self.through_attention is not None:
            return None
        return self.entries[0]


def _written(op: str, args, out) -> list[torch.Tensor]:
    """The tensors an op made or wrote: its outputs, or for a write that returns nothing
    (`t[i] = v`) the tensor written into."""
    outs = op_tensors(out)
    if outs or not (_ops.lookup(op).family == _ops.WRITE or _ops.is_inplace(op)):
        return outs
    return op_tensors(args)[:1]


class _Record:
    """Run one: every op's name and its outputs' values."""

    def __init__(self) -> None:
        self.steps: list[tuple[str, list[torch.Tensor]]] = []

    def before(self, func, op: str, args, kwargs) -> None:
        pass

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        self.steps.append((op, [t.detach().clone() for t in _written(op, args, out)]))


class _Compare:
    """Run two: each op's outputs against run one's, on the real positions; the entries
    each differing tensor descends from.

    A tensor with an axis of the probed tokens shows which positions moved: it moved on
    real positions (`dirty`) or not at all. A tensor without one (a pooled vector, the
    positions cut, shifted or regrouped into windows) that moved only carries the padded
    values (`carried`), from the op that took them off their positions (its origin). An
    op that lays carried values onto real positions is the entry where it mixes them in
    (the convolution after the pad that shifts its input); where it only moves them (a
    cut back to the tokens after a padded convolution) the origin stays the entry, and
    so it does for an attention op over carried keys (compressed or pooled positions:
    no mask could hide them)."""

    def __init__(self, first: list, length: int, padded: list[int], rtol: float) -> None:
        self.session: Any = None
        self.first = first
        self.length = length
        self.keep = torch.tensor([p for p in range(length) if p not in set(padded)])
        self.rtol = rtol
        self.index = 0
        self.diverged = False
        self.entries: list[Entry] = []
        self.dirty = WeakTensorKeyDictionary()  # tensor -> frozenset of entry indices
        self.carried = WeakTensorKeyDictionary()  # tensor -> frozenset of origin indices
        self.weights = WeakTensorKeyDictionary()  # softmax outputs and what follows them

    def before(self, func, op: str, args, kwargs) -> None:
        pass

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        if self.diverged:
            return
        i, self.index = self.index, self.index + 1
        if i >= len(self.first) or self.first[i][0] != op:
            self.diverged = True  # the runs took different paths: no op-by-op comparison
            return
        operands = op_tensors((args, kwargs))
        outs = _written(op, args, out)
        reads_weights = any(t in self.weights for t in operands)
        family = _ops.lookup(op).family
        attention = (
            family in _ATTENTION or op in _SOFTMAX or (reads_weights and family == _ops.PRODUCT)
        )
        if op in _SOFTMAX or (reads_weights and family != _ops.PRODUCT):
            for t in outs:
                self.weights[t] = True
        sources: frozenset = frozenset()
        carried: frozenset = frozenset()
        for t in operands:
            sources |= self.dirty.get(t, frozenset())
            carried |= self.carried.get(t, frozenset())
        seen = [self._compare(t, a) for t, a in zip(outs, self.first[i][1], strict=False)]
        shown = hidden = None  # the lineage of the outputs that moved, by kind
        for t, (moved, visible) in zip(outs, seen, strict=False):
            if not moved:
                self.dirty.pop(t, None)  # (written in place back to what run one holds)
                self.carried.pop(t, None)
            elif visible or sources:
                if shown is None:
                    if sources:
                        shown = sources | carried
                    elif carried and (attention or family in _MOVES):
                        shown = carried  # laid back onto positions: the origin mixed them
                    elif carried:
                        shown = self._entry(op, count, False)  # this op mixes them in
                    else:
                        shown = self._entry(op, count, attention)
                self.dirty[t] = shown
                self.carried.pop(t, None)
            else:
                if hidden is None:
                    hidden = carried or self._entry(op, count, attention)
                self.carried[t] = hidden
                self.dirty.pop(t, None)

    def _entry(self, op: str, count: int, attention: bool) -> frozenset:
        self.entries.append(Entry(self._where(count, op), op, attention))
        return frozenset((len(self.entries) - 1,))

    def _compare(self, b: torch.Tensor, a: torch.Tensor) -> tuple[bool, bool]:
        """(whether `b` moved from `a` on the real positions, whether it has an axis of
        the probed tokens to tell them by)."""
        if a.shape != b.shape or a.dtype != b.dtype:
            return True, False
        meta = self.session.metas.get(b) if self.session is not None else None
        axes = meta.axes if meta is not None else ()
        keep = self.keep
        dims = seq_dims(b, axes, self.length)
        for d in dims:
            a, b = take(a, d, keep), take(b, d, keep)
        if not b.numel():
            return False, bool(dims)
        a = a.to(b.device)
        if not b.is_floating_point():
            return not torch.equal(a, b), bool(dims)
        return _moved(a, b, self.rtol), bool(dims)

    def _where(self, count: int, op: str) -> str:
        events = self.session.trace.events
        if len(events) > count and events[-1].op == op:
            return describe_event(events[-1])
        return op


def _moved(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    """Whether some value moved beyond rounding: by more than `rtol` of its own magnitude
    plus the tensor's typical one (the median magnitude: a mask's huge fill values do not
    make every other value's move look small); NaN in one run only moved too."""
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if bool((nan_a != nan_b).any()):
        return True
    a, b = a[~nan_a].double(), b[~nan_a].double()
    if not a.numel():
        return False
    same = a == b  # equal infinities too
    if bool(same.all()):
        return False
    size = a.abs()
    finite = size[torch.isfinite(size) & (size > 0)]
    typical = float(finite.median()) if finite.numel() else 0.0
    gap = (a - b).abs()
    return bool(((gap > rtol * (torch.maximum(size, b.abs()) + typical)) & ~same).any())


def _run(s: Subject, inputs, observer):
    import warnings

    from .. import _config
    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    args, kwargs = inputs
    with _config.forced_on(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with recording_session(Trace(mode="warn"), s.model, args, kwargs) as session:
            observer.session = session
            with session.observe(observer):
                return s.model(*args, **kwargs)


def padding_paths(
    s: Subject, given, changed, compared: list, length: int, padded: list[int]
) -> Paths | None:
    """The entries through which the changed padded positions (`padded` of the `length`
    tokens) reach the `compared` output leaves; None where it cannot be told (the runs
    took different paths, or no entry reaches them)."""
    record = _Record()
    _run(s, given, record)
    compare = _Compare(record.steps, length, padded, s.rtol)
    out = _run(s, changed, compare)
    if compare.diverged or not compare.entries:
        return None
    reached: set[int] = set()
    for leaf in compared:
        for _, t in leaves(pick(out, leaf.path)):
            reached |= compare.dirty.get(t, frozenset())
            reached |= compare.carried.get(t, frozenset())  # a pooled output
    if not reached:
        return None
    return Paths(tuple(compare.entries[i] for i in sorted(reached)))


def not_promised(entry: Entry, dev: float) -> str:
    """The inconclusive reason where the padded values reach the real tokens outside
    attention."""
    family = _ops.lookup(entry.op).family
    what = f" ({_WHAT[family]})" if family in _WHAT else ""
    return (
        f"the padded positions reach the real tokens through {entry.where}{what}, not "
        "through attention: the mask does not promise key-padding invariance here\n"
        f"  changing them moved the real tokens' outputs by {dev:.2g} of the output's scale; "
        "no attention op let a padded key through"
    )
