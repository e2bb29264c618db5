"""Replayed steps whose effects are made when first read, not when replayed.

What a replayed step does to the axes (its outputs' dims and names, what it teaches about
its inputs) follows from the recording and from the steps before it, nothing else: the
replay compared everything else before it ran the op. So a replaying session defers it.
Each output gets a *pending* meta that holds only its slot, which is what the next steps
compare, and the session's ledger keeps the step with its metas. The first read of any
other field of a pending meta (a rule, once the replay diverged; an event built; a name
shown) pays the ledger: every deferred step is made, in order, on the metas it was owed
to, as the replay would have made it when it ran. From then on the session makes the
steps it still replays at once, so a meta that was read is never stale.

A guarded forward whose trace nobody reads never pays, and makes no axes at all: the
usual case, on every forward of a model under development. See docs/design.md ("Effects
made when read").
"""

import weakref

import torch

from .._memo import Memo
from .._names import dims as _dims
from . import replay_effects as _replay_effects
from .meta import FRESH, FRESH_PARAM, TensorMeta

# Steps a ledger owes before the session pays it at the next forward's start: what a long
# `with trace():` block keeps of its replayed metas stays bounded.
MAX_OWED = 65_536

# (state name, a parameter, ndim) -> the origin of each axis: a model's state names, bounded.
_ORIGINS = Memo("fresh origins", 4096)


class Ledger:
    """The deferred steps of one session, in order: `steps[k]` with `metas[k]`, its
    inputs' metas then its outputs' (the tuple its event holds too)."""

    __slots__ = ("steps", "metas", "paid", "paying", "ref", "__weakref__")

    def __init__(self) -> None:
        self.steps: list = []
        self.metas: list = []
        self.paid = False  # paid once: the session makes its steps at once from then on
        self.paying = False
        # What a pending meta holds: a weak reference, so that a ledger and the metas it
        # owes are no reference cycle (the session, then the trace, hold the ledger).
        self.ref = weakref.ref(self)

    def pay(self) -> None:
        """Make every deferred step, in order. Idempotent."""
        if self.paid or self.paying:
            return
        self.paying = True
        try:
            for step, metas in zip(self.steps, self.metas, strict=True):
                _make(step, metas)
        finally:
            self.steps, self.metas = [], []
            self.paid = True
            self.paying = False


def pending(slot: int, owed) -> TensorMeta:
    """A meta with only its slot; `owed` is the weak reference of the ledger that fills it."""
    meta = TensorMeta.__new__(TensorMeta)
    meta.slot = slot
    meta._owed = owed
    return meta


def fill_fresh(meta: TensorMeta, shape, nature: tuple) -> None:
    """Give `meta` the axes of a tensor first seen in a replayed step, whose `_first_seen`
    is `nature` (its type first, its state name second): `Session._fresh_meta`'s, made
    from the recorded shape."""
    name = nature[1]
    param = issubclass(nature[0], torch.nn.Parameter)
    origins = _ORIGINS.get((name, param, len(shape)))
    if origins is None:
        origins = _origins(name, param, len(shape))
    axes: list = []
    for size, origin in zip(shape, origins, strict=True):
        if size == 1:
            axes.append(())  # `_dims.fresh`: size 1 has no atoms
        else:
            dim = _dims.Dim(int(size))
            dim.origin = origin
            dim.param = dim.origin if param else ""
            axes.append(((dim, 1, dim.size),))
    meta.fill(tuple(axes), FRESH_PARAM if param else FRESH)


def _origins(name: str, param: bool, ndim: int) -> tuple:
    origin = "a parameter" if param else "a tensor made outside the trace"
    found = tuple(f"axis {i} of {name}" if name else origin for i in range(ndim))
    return _ORIGINS.put((name, param, ndim), found)


def _make(step, metas: tuple) -> None:
    """One deferred step: its first-seen inputs' axes, then its effects."""
    count = len(step.inputs)
    ins = list(metas[:count])
    made = metas[count:]
    if step.firsts:
        firsts = iter(step.firsts)
        for k, (slot, shape, _) in enumerate(step.inputs):
            if slot is None:
                nature = next(firsts)[1]
                meta = ins[k]
                if meta._owed is not None:  # (a tensor given twice is filled once)
                    fill_fresh(meta, shape, nature)
    effects = step.effects
    try:
        objs = _replay_effects.resolve(effects.paths, ins) if effects.paths else None
        _replay_effects.apply(effects, objs, ins, made)
    except Exception:
        # Not the axes the step was recorded on: the replay guarantees they are, so this is
        # shapeguard's own fault. Unnamed axes of the right sizes, never a crash of a read.
        for meta, (_, facts), shape in zip(made, effects.templates, step.outputs, strict=False):
            if meta._owed is not None:
                meta.fill(_dims.fresh_axes(tuple(shape)), facts)
