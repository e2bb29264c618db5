"""Sessions that repeat, replayed instead of recomputed.

What a session computes for one op (the verdicts of the rules, the axes and names of the
outputs, what the op teaches about its inputs) is a function of the op and its arguments, the
user's line, the modules it runs in, and the provenance of its inputs, which the earlier steps
of the same session made from an empty table. So two sessions opened by the same party (one
guarded module, one `trace(model)`, one `with shapeguard.trace():` line) that make the same
calls in the same order compute the same things, step for step. A *step* is one dispatched
call, or a module entered or left; two steps are the same when they have the same function,
the same line, the same innermost module, the same arguments besides tensors, and tensor
inputs of the same shapes and dtypes that the same earlier steps made (or, for a tensor first
seen there, of the same kind: a parameter by its name, a tensor made outside by its layout).

The second session with such a history replays the first one's steps: the rules are not run
again (a recorded step had no finding), and the outputs' metas and the changes to the inputs'
axes are made from the recorded template. The first step that differs ends the replay; the
session runs as usual from there, on the state the replay made, which is the state it would
have computed. What a rule reads besides the op's inputs is part of the step: tensor values
(a mask's) by their content, a tensor read from the user's frame (`B, T, C = x.shape` for a
view) by the step that made it. A step with a finding, a step whose effects reach axes outside
its inputs, or any change to the session made outside a step (a composite checked at its
boundary) is a barrier: a replay stops there.

Sessions record only from the second one of an opener on (a forward run once pays nothing),
and replay from the third on. See docs/design.md ("Sessions that repeat").

Comparing a call with a step is `_trace/replay_match.py`; a step's effects on the axes,
captured and made again, are `_trace/replay_effects.py`; the session side is
`_trace/replay_layer.py`.
"""

import dataclasses
import os
import weakref

import torch

from .._errors import InternalError
from .._memo import Memo

OP, ENTER, EXIT, NAME, BARRIER = range(5)


# Outputs of one op that a template can name (torch.split into more parts is a barrier).
MAX_OUTPUTS = 1024


# Recordings kept per opener: ways its sessions start (a helper that traces several
# models in turn, the lengths of a generate loop).
_VARIANTS = 16


_MAX_OPENERS = 512  # openers without a module (a `with trace():` line) remembered


class Why:
    """Why a replay stepped aside: the keys of `TraceData.replay_stops`. Where the replay
    reached the end of what was recorded, the reason is the recording's, prefixed
    "recorded: " (the step there was a barrier, for one of the reasons below the line)."""

    ENDED = "the recorded session ended here"
    OTHER_START = "no recording starts as this session does"
    OTHER_FUNCTION = "another function than the recorded step's"
    OTHER_LINE = "the op at another line"
    OTHER_MODULE = "the op in another module"
    OTHER_ARGUMENTS = "other arguments besides tensors"
    OTHER_INPUTS = "other tensor inputs (count, shape, dtype or the step that made them)"
    OTHER_FIRST_SEEN = "another tensor first seen than the recorded one"
    OTHER_VALUES = "other tensor values a rule reads, with a finding"
    OTHER_FRAME = "other tensors read from the user's frame"
    OTHER_AXES = "inputs without the axes the step was recorded on"
    OTHER_OUTPUTS = "outputs of other shapes than recorded"
    DISTRIBUTED = "an op of torch.distributed's own (never recorded)"
    OTHER_ENTER = "another module entered"
    OTHER_EXIT = "another module left"
    OBSERVED = "an observer was added"
    OWN_FAILURE = "a failure of shapeguard's own code"
    # Why a session stopped recording (a barrier step).
    FINDING = "a finding, or a rule's own failure"
    FLAGGED = "an input that carries a finding"
    SYMBOLIC = "symbolic sizes"
    UNKEYABLE = "an argument no key compares"
    OUTSIDE = "effects beyond the step's inputs"
    SUSPENDED = "a finding or a composite on entering a module"


def barrier(why: str) -> "Step":
    """The barrier step recorded where a session stopped recording, for `why` (one per
    reason, shared)."""
    found = _BARRIERS.get(why)
    if found is None:
        found = _BARRIERS[why] = Step(BARRIER)
        found.why = why
    return found


# Not a memo: one shared step per `Why` reason, so bounded by that class.
_BARRIERS: dict = {}


class ReplayMismatch(InternalError):
    """`SHAPEGUARD_REPLAY=check`: the reference path made another step than the replay
    followed (a replay would have made other effects than the reference path)."""


def verifying() -> bool:
    """Whether sessions verify their replays (`SHAPEGUARD_REPLAY=check`): each step a replay
    matches runs the reference path, whose step must be the one recorded."""
    return os.environ.get("SHAPEGUARD_REPLAY", "").strip().lower() == "check"


def verify(expected: "Step", found: "Step | None", why: str, op: str) -> None:
    """Raise `ReplayMismatch` where `found`, the step the reference path recorded (None: a
    barrier, for `why`), is not `expected`, the recorded step a replay matched."""
    if found is None:
        differences = [f"the reference path records no step: {why}"]
    else:
        differences = [
            f"{name}: replayed {a!r}, reference {b!r}"
            for name, a, b in zip(_COMPARED, _compared(expected), _compared(found), strict=True)
            if a != b
        ]
    if differences:
        raise ReplayMismatch(
            f"shapeguard: SHAPEGUARD_REPLAY=check: the replay of {op or 'a module entry'} "
            "differs from the reference path: " + "; ".join(differences)
        )


_COMPARED = (
    "kind",
    "function",
    "site",
    "module",
    "inputs",
    "inputs first seen",
    "arguments",
    "values read",
    "frame reads",
    "outputs",
    "event",
    "first entry",
    "root entry",
    "dim paths",
    "dims made",
    "dims unified",
    "dim states",
    "input facts",
    "output axes",
    "output facts",
    "reach",
)


def _compared(step: "Step") -> tuple:
    effects = step.effects
    module = step.module() if step.module is not None else None
    made = (
        (effects.paths, effects.news, effects.merges, effects.states, effects.changes)
        if effects is not None
        else (None,) * 5
    )
    outs = (
        (tuple(t for t, _ in effects.templates), tuple(f for _, f in effects.templates))
        if effects is not None
        else (None, None)
    )
    return (
        step.kind,
        step.func,
        step.site,
        id(module),
        step.inputs,
        tuple(first[1] for first in step.firsts),
        step.args,
        tuple(value[0] for value in step.values),
        step.extras,
        step.outputs,
        step.event,
        step.first,
        step.root,
        *made,
        *outs,
        tuple(dataclasses.replace(r, event=-1) for r in step.reach),
    )


class Step:
    """One step of a recorded session: what to compare, and the template of its effects."""

    __slots__ = (
        "kind",
        "func",  # the function (OP), a name step's key (NAME)
        "site",
        "where",  # OP: `_source.site_key` of the user's frame where `site` was last seen
        "match",  # OP: `matcher` of the step (None: not made yet; False: none)
        "module",  # weak reference to the innermost module (OP) or the module (ENTER/EXIT)
        "inputs",  # per input: (slot, None for a tensor first seen here; shape; dtype)
        "firsts",  # per input first seen here: (weak reference, what kind of tensor it is)
        "args",  # `args_check` of the arguments besides tensors
        "values",  # ((input index, fingerprint), ...)
        "extras",  # ((frame local name, slot), ...): tensors the rules read from the frame
        "effects",
        "outputs",  # output shapes
        "event",  # (op, module path, module class, site, inputs, outputs) without metas
        "first",  # ENTER: the session's first entry into the module
        "root",  # ENTER: the root's inputs were named here
        "why",  # BARRIER: why the session stopped recording (`Why`)
        "reach",  # OP: the attention reach its rules read (`Recording.keep_reach`), kept again
    )

    def __init__(self, kind: int) -> None:
        self.kind = kind
        self.func = None
        self.site = None
        self.where = None
        self.match = None
        self.module = None
        self.inputs: tuple = ()
        self.firsts: tuple = ()
        self.args = ()
        self.values: tuple = ()
        self.extras = ()
        self.effects = None
        self.outputs = ()
        self.event = None
        self.first = False
        self.root = False
        self.why = ""
        self.reach: tuple = ()


def with_reach(step: Step, reach: tuple) -> Step:
    """`step` as its replay makes it where its rules read other values (another batch's
    padding: `ReplayLayer._values_pass`) and so another reach: what `verify` compares."""
    copy = Step(step.kind)
    for name in Step.__slots__:
        setattr(copy, name, getattr(step, name))
    copy.reach = reach
    return copy


class Recording:
    """The steps of one finished session."""

    __slots__ = ("steps",)

    def __init__(self, steps: list) -> None:
        self.steps = steps


class _Opener:
    __slots__ = ("sessions", "recordings")

    def __init__(self) -> None:
        self.sessions = 0
        self.recordings: list[Recording] = []


# Not a memo: a module's openers live and die with it (weak keys), one per kind of session.
_by_module: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Openers without a module (a `with trace():` line): as many as a process has such lines.
_by_key = Memo("replay openers", _MAX_OPENERS)


def active() -> bool:
    """Whether sessions replay: `SHAPEGUARD_REPLAY=0` turns it off (read per session)."""
    return os.environ.get("SHAPEGUARD_REPLAY", "1").strip().lower() not in _OFF


_OFF = ("0", "false", "off", "no")


def opener(kind: str, owner) -> _Opener | None:
    """The record of sessions opened by `owner` (a module, or a hashable key); None when
    there is none or replay is off."""
    if owner is None or not active():
        return None
    if not isinstance(owner, torch.nn.Module):
        key = (kind, owner)
        found = _by_key.get(key)
        if found is None:
            found = _by_key.put(key, _Opener())
        return found
    try:
        table = _by_module.get(owner)
        if table is None:
            table = _by_module[owner] = {}
    except TypeError:
        return None
    found = table.get(kind)
    if found is None:
        found = table[kind] = _Opener()
    return found


def _head(step: Step) -> tuple:
    """How a session starts: a forward of one model at one input signature (decode steps
    of `generate` are one per length), or one op at one line."""
    module = step.module() if step.module is not None else None
    inputs: tuple = step.inputs
    return (step.kind, step.func, step.site, id(module), tuple(i[1:] for i in inputs))


def remember(record: _Opener, steps: list) -> None:
    """Keep a finished session's steps as the newest recording of its opener (one per way
    the opener's sessions start: a helper that traces several models keeps each)."""
    if not steps or steps[0].kind == BARRIER:
        return
    head = _head(steps[0])
    recordings = [r for r in record.recordings if _head(r.steps[0]) != head]
    record.recordings = [Recording(steps), *recordings][:_VARIANTS]


def forget_all() -> None:
    """Drop every recording (tests; a source file that changed drops its sites' steps too)."""
    _by_module.clear()
    _by_key.clear()
