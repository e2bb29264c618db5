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
"""

import os
import weakref

import torch
from torch.overrides import TorchFunctionMode

from .. import _ops
from .._errors import InternalError
from .._names import dims as D

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


_BARRIERS: dict = {}


class ReplayMismatch(InternalError):
    """`SHAPEGUARD_REPLAY=check`: the reference path made another step than the replay
    followed (a replay would have made other effects than the reference path)."""


def checking() -> bool:
    """Whether sessions check their replays (`SHAPEGUARD_REPLAY=check`): each step a replay
    matches runs the reference path, whose step must be the one recorded."""
    return os.environ.get("SHAPEGUARD_REPLAY", "").strip().lower() == "check"


def check(expected: "Step", found: "Step | None", why: str, op: str) -> None:
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
    )


class Unkeyable(Exception):
    """An argument whose equality says nothing (or that holds tensors out of reach)."""


class Outside(Exception):
    """A step's effects reach axes that are not its inputs' (or that it made)."""


_TENSOR = ("tensor",)  # a tensor's place in an argument key
_NUMBER = ("number",)  # a number that no rule and no axis rule of the op reads
_NUMBERS = (int, float, complex)
_PLAIN = frozenset(
    {
        int,
        float,
        complex,
        bool,
        str,
        type(None),
        type(Ellipsis),
        torch.dtype,
        torch.device,
        torch.Size,
        torch.memory_format,
        torch.layout,
    }
)


def _key(value, loose: bool):
    kind = type(value)
    if loose and kind in _NUMBERS:
        return _NUMBER
    if kind in _PLAIN:
        return value
    if isinstance(value, torch.Tensor):
        return _TENSOR
    if kind is tuple or kind is list:
        return (kind, tuple(_key(v, loose) for v in value))
    if kind is slice:
        parts = (value.start, value.stop, value.step)
        if any(isinstance(p, torch.Tensor) for p in parts):
            raise Unkeyable
        return (slice, parts)
    raise Unkeyable


_EXACT, _KEYED, _SAME_TYPE = 1, 3, 4


def args_check(args: tuple, kwargs: dict, loose: bool) -> tuple:
    """How a replay compares the arguments besides tensors: (count, keyword names,
    ((position or name, how, expected), ...)). Raises Unkeyable."""
    checks: list[tuple] = []
    items = [*enumerate(args), *kwargs.items()]
    for where, value in items:
        kind = type(value)
        if isinstance(value, torch.Tensor):
            continue  # counted with the inputs: their number, shapes and makers
        if loose and kind in _NUMBERS:
            # Any number of its type: the type decides the result's dtype (a complex
            # scalar makes a complex tensor), the value nothing the session computes.
            checks.append((where, _SAME_TYPE, kind))
        elif kind in _PLAIN:
            checks.append((where, _EXACT, value))
        else:
            try:
                checks.append((where, _KEYED, (_key(value, loose), loose)))
            except Unkeyable:
                if not loose:
                    raise
                # Read by nothing (a profiler's handle to record_function): its type holds.
                checks.append((where, _SAME_TYPE, kind))
    return (len(args), tuple(kwargs), tuple(checks))


def same_args(check: tuple, args: tuple, kwargs: dict) -> bool:
    """Whether `args_check` of these arguments would be `check` (tensors aside)."""
    count, names, checks = check
    if len(args) != count or (tuple(kwargs) != names if kwargs else names):
        return False
    return same_checks(checks, args, kwargs)


def same_checks(checks: tuple, args: tuple, kwargs: dict) -> bool:
    for where, how, expected in checks:
        value = args[where] if type(where) is int else kwargs[where]
        if how == _EXACT:
            if type(value) is not type(expected) or value != expected:
                return False
        elif how == _SAME_TYPE:
            if type(value) is not expected:
                return False
        elif not _same_key(value, expected[0], expected[1]):
            return False
    return True


def _same_key(value, key, loose: bool) -> bool:
    """`_key(value, loose) == key`, without building the key for the common cases (a slice
    of ints, a flat tuple or list of plain values and tensors)."""
    kind = type(value)
    if kind is slice:
        start, stop, step = value.start, value.stop, value.step
        if (
            (start is None or type(start) is int)
            and (stop is None or type(stop) is int)
            and (step is None or type(step) is int)
        ):
            return key[0] is slice and (start, stop, step) == key[1]
    elif (kind is tuple or kind is list) and key[0] is kind and len(value) == len(key[1]):
        for v, expected in zip(value, key[1], strict=True):
            k = type(v)
            if loose and k in _NUMBERS:
                found: object = _NUMBER
            elif k in _PLAIN:
                found = v
            elif isinstance(v, torch.Tensor):
                found = _TENSOR
            else:
                break  # nested: compared below
            if found is not expected and found != expected:
                return False
        else:
            return True
    try:
        return _key(value, loose) == key
    except Unkeyable:
        return False


# -- matchers: a step's comparison of the arguments and inputs, compiled ---------------------
def compare(step: "Step", args: tuple, kwargs: dict, get):
    """What a replay's generic comparison answers for a step whose `matcher` is not False:
    None where the step is not this call (`same_args`, then each input's dtype, shape and
    slot; a tensor first seen here must be the recorded one, in the recorded layout), else
    the inputs' metas (None for one first seen here; with the inputs, as `(metas,
    tensors)`, when the step has such inputs), or GENERIC where a first-seen input is not
    the recorded tensor. `get` is the tensor table's `lookup`. The reference `matcher`'s
    code is tested against, on recorded steps (tests/test_replay_check.py)."""
    if not same_args(step.args, args, kwargs):
        return None
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if len(tensors) != len(step.inputs):
        return None
    firsts = iter(step.firsts)
    metas = []
    for t, (slot, shape, dtype) in zip(tensors, step.inputs, strict=True):
        entry = get(id(t))
        meta = entry[1] if entry is not None and entry[0]() is t else None
        if slot is None:
            ref, nature = next(firsts)
            if meta is not None:
                return None
            if ref() is not t:
                return GENERIC
            if (t.stride(), t.device.type, t.requires_grad) != nature[3:]:
                return None
        elif meta is None or meta.slot != slot:
            return None
        if t.dtype is not dtype or t.shape != shape:
            return None
        metas.append(meta)
    return (metas, tensors) if step.firsts else metas


def matcher(step: "Step"):
    """A function `(args, kwargs, get)` that answers what a replay's generic comparison
    (`args` by `same_args`, then each input's dtype, shape and slot, and an input first
    seen here by `Session._same_firsts`; `get` is the tensor table's `dict.get`) answers
    for this step, in straight code: None where the step is not this call, else the
    inputs' metas (None for one first seen here; with the inputs, as `(metas, tensors)`,
    when the step has such inputs), or GENERIC where only the generic comparison can tell
    (a first-seen input that is not the recorded tensor). False where the step needs the
    generic comparison always (tensor values or frame locals read, tensors in a list).

    Generated code, kept for a measured gain: on the 137 matchable steps of a replayed
    tiny-Llama forward (bench/cost.py's), the matcher compares a step in 3.0-4.5 us where
    `compare`, the plain function it is tested against on recorded steps
    (tests/test_replay_check.py), takes 7.3-8.2 us (2 loaded cores, 5 rounds each); in
    whole replayed forwards the difference was within the machine's noise (issue 27)."""
    compared: tuple = step.args
    count, names, checks = compared
    inputs: tuple = step.inputs
    recorded: tuple = step.firsts
    if step.values or step.extras or any(ref is None for ref, _ in recorded):
        return False
    for _, how, expected in checks:
        if how == _SAME_TYPE and issubclass(expected, tuple | list):
            return False  # the generic gathers the tensors a tuple or list holds
    where_tensors = [k for k in range(count) if not any(c[0] == k for c in checks)]
    where_tensors += [n for n in names if not any(c[0] == n for c in checks)]
    if len(where_tensors) != len(inputs):
        return False  # tensors inside a list or tuple (torch.cat): the generic gathers them
    unseen = tuple(slot is None for slot, _, _ in inputs)
    shape_key = (count, names, tuple(c[:2] for c in checks), tuple(where_tensors), unseen)
    make = _matchers.get(shape_key)
    if make is None:
        if len(_matchers) > 4096:
            _matchers.clear()
        make = _compile_matcher(count, names, checks, where_tensors, unseen)
        _matchers[shape_key] = make
    constants = [c[2] for c in checks]
    firsts = iter(recorded)
    for slot, shape, dtype in inputs:
        if slot is None:
            ref, nature = next(firsts)
            constants += (dtype, shape, ref, nature[3:])
        else:
            constants += (dtype, shape, slot, None)
    return make(tuple(constants))


GENERIC = object()  # what a matcher returns where only the generic comparison can tell
_matchers: dict = {}


def _compile_matcher(count: int, names: tuple, checks: tuple, where_tensors: list, unseen):
    def value(where) -> str:
        return f"a[{where}]" if type(where) is int else f"k[{where!r}]"

    lines = [f"if len(a) != {count}: return None"]
    lines.append(f"if tuple(k) != {names!r}: return None" if names else "if k: return None")
    for n, (where, how, _) in enumerate(checks):
        v = value(where)
        if how == _EXACT:
            lines.append(f"v = {v}")
            lines.append(f"if type(v) is not type(c[{n}]) or v != c[{n}]: return None")
        elif how == _SAME_TYPE:
            lines.append(f"if type({v}) is not c[{n}]: return None")
        else:
            lines.append(f"if not same_key({v}, c[{n}][0], c[{n}][1]): return None")
    metas, tensors = [], []
    for j, where in enumerate(where_tensors):
        d, sh, sl, nat = (len(checks) + 4 * j + x for x in range(4))
        # Which tensor before what shape: a fake tensor (make_fx, export) is never the
        # recorded one, and its symbolic sizes are never compared (that would specialize them).
        lines.append(f"t{j} = t = {value(where)}")
        lines.append("if not isinstance(t, Tensor): return None")
        lines.append("e = g(id(t))")
        same = f"t.dtype is not c[{d}] or t.shape != c[{sh}]"
        if unseen[j]:
            # `Session._same_firsts`: the recorded tensor, in the recorded layout.
            lines.append("if e is not None and e[0]() is t: return None")
            lines.append(f"if c[{sl}]() is not t: return generic")
            lines.append(
                f"if (t.stride(), t.device.type, t.requires_grad) != c[{nat}] or {same}:"
                " return None"
            )
            metas.append("None")
        else:
            lines.append(
                f"if e is None or e[0]() is not t or e[1].slot != c[{sl}] or {same}: return None"
            )
            metas.append("e[1]" if j == len(where_tensors) - 1 else f"m{j}")
            if j != len(where_tensors) - 1:
                lines.append(f"m{j} = e[1]")
        tensors.append(f"t{j}")
    found = f"[{', '.join(metas)}]"
    lines.append(f"return {found}, [{', '.join(tensors)}]" if any(unseen) else f"return {found}")
    body = "".join(f"        {line}\n" for line in lines)
    source = f"def make(c):\n    def match(a, k, g):\n{body}    return match\n"
    scope = {
        "Tensor": torch.Tensor,
        "same_key": _same_key,
        "generic": GENERIC,
    }
    exec(compile(source, "<shapeguard replay match>", "exec"), scope)
    return scope["make"]


def loose_numbers(spec, rules, args: tuple) -> bool:
    """Whether numbers in the arguments change nothing the session computes: no rule reads
    this call (none registered, or each declares tensor operands the call lacks: `x * 0.5`
    is no broadcast of two tensors), and the axis rules of elementwise families read
    tensors only. An optimizer's step sizes, a dropout's p."""
    if spec.family not in (_ops.SAME, _ops.BINARY, _ops.OTHER):
        return False
    from ..checks import applies

    return not any(applies(r, args) for r in rules)


# -- tensor values a rule reads ------------------------------------------------------------
# Queries that read metadata only; any other call on an input is a read of its values
# (item, tolist and __bool__ are queries that read values).
_METADATA = _ops.family_ops(_ops.QUERY) - _ops.spellings_where(reads_values=True)


class ValueReads(TorchFunctionMode):
    """Notes which inputs of a call the rules and axis rules read the values of."""

    def __init__(self, tensors: list) -> None:
        super().__init__()
        self.ids: dict[int, list[int]] = {}
        for i, t in enumerate(tensors):
            self.ids.setdefault(id(t), []).append(i)
        self.read: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.ids and _ops.name_of(func) not in _METADATA:
            for value in (*args, *kwargs.values()):
                found = self.ids.get(id(value))
                if found is None and type(value) in (tuple, list):
                    for v in value:
                        self.read.update(self.ids.get(id(v), ()))
                elif found is not None:
                    self.read.update(found)
        return func(*args, **kwargs)


class _Never:
    """A fingerprint equal to nothing (values that could not be read)."""

    def __eq__(self, other) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def fingerprint(tensor) -> tuple:
    """What a step remembers of a tensor whose values a rule read: the tensor itself (weakly,
    with its version counter) and a hash of its bytes."""
    if tensor.is_meta:
        return (None, 0, None)  # no values: the rules read none
    try:
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        raw = data.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        digest: object = (len(raw), hash(raw))
    except Exception:  # a layout with no plain bytes: this step is never replayed
        digest = _Never()
    try:
        ref = weakref.ref(tensor)
    except TypeError:
        ref = None
    return (ref, tensor._version, digest)


def same_values(tensor, recorded: tuple) -> bool:
    ref, version, digest = recorded
    if digest is None:
        return tensor.is_meta
    if ref is not None and ref() is tensor and tensor._version == version:
        return True
    return fingerprint(tensor)[2] == digest


# -- steps -----------------------------------------------------------------------------------
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


class Effects:
    """What one step did to the axes, relative to its inputs.

    `paths` find the dims the template needs from the inputs' metas: `(0, i, a, j)` is the
    dim object of atom j of axis a of input i, `(1, i, a, j)` its root, `(2, k)` the root of
    the alias of the dim found by path k. Dims the step made follow them in the same list
    of objects; every reference below is an index into it."""

    __slots__ = (
        "paths",
        "news",
        "merges",
        "states",
        "changes",
        "templates",
        "simple",
    )

    def __init__(self, paths, news, merges, states, changes, outs) -> None:
        # Outputs made of the inputs' axes, nothing changed: most ops.
        self.simple = not (news or merges or states or changes)
        self.paths = paths
        self.news = news  # per dim made: (size, parent, state)
        self.merges = merges  # (root, new parent): roots unified into another
        self.states = states  # (root, state): roots whose facts changed
        self.changes = changes  # (input index, `Facts`): inputs' metas whose facts changed
        # Per output: (the template of its dims, for `build`; its `Facts`).
        self.templates = outs


_KEEP = -1  # an alias the step did not change


class Capture:
    """Records the effects of one step on the axes of its inputs (`begin`, then `end`)."""

    __slots__ = (
        "metas",
        "serial",
        "atom_ix",
        "root_ix",
        "paths",
        "snaps",
        "meta_snaps",
        "touched",
        "token",
    )

    def __init__(self, metas: list) -> None:
        self.metas = metas
        self.serial = D.serial()
        atom_ix: dict = {}
        root_ix: dict = {}
        paths: list = []
        for i, m in enumerate(metas):
            for a, axis in enumerate(m.dims):
                for j, atom in enumerate(axis):
                    d = atom[0]
                    if d not in atom_ix:
                        atom_ix[d] = len(paths)
                        paths.append((0, i, a, j))
                    r = d.find()
                    if r not in root_ix:
                        if r is d:
                            root_ix[r] = atom_ix[d]
                        else:
                            root_ix[r] = len(paths)
                            paths.append((1, i, a, j))
        frontier = list(root_ix)
        for _ in range(4):  # names read through aliases go four deep (`dims.dim_name`)
            found = []
            for r in frontier:
                alias = r.alias
                if alias is None:
                    continue
                ar = alias[0].find()
                if ar not in root_ix:
                    root_ix[ar] = len(paths)
                    paths.append((2, root_ix[r]))
                    found.append(ar)
            frontier = found
        self.atom_ix = atom_ix
        self.root_ix = root_ix
        self.paths = paths
        self.snaps = {r: D.state_of(r) for r in root_ix}
        self.meta_snaps = [(m.facts, m.dims) for m in metas]
        self.touched, self.token = D.watch()

    def abandon(self) -> None:
        D.unwatch(self.token)

    def end(self, out_metas: list) -> Effects:
        touched = self.touched
        D.unwatch(self.token)
        serial = self.serial
        atom_ix, root_ix = self.atom_ix, self.root_ix
        base = len(self.paths)
        news: list = []
        new_ix: dict = {}

        def ref(d) -> int:
            k = atom_ix.get(d)
            if k is None:
                k = root_ix.get(d)
            if k is None:
                if d.serial <= serial:
                    raise Outside
                k = new_ix.get(d)
                if k is None:
                    k = new_ix[d] = base + len(news)
                    news.append(d)
            return k

        for r in touched or ():
            if r not in root_ix and r.serial <= serial:
                raise Outside
        metas = self.metas
        dims_ix: dict = {}
        axis_ix: dict = {}
        for i, m in enumerate(metas):
            dims_ix.setdefault(m.dims, i)
            for a, axis in enumerate(m.dims):
                axis_ix.setdefault(axis, (i, a))
        outs = []
        for om in out_metas:
            at = dims_ix.get(om.dims)
            if at is not None:
                template: object = at
            else:
                axes = []
                for axis in om.dims:
                    ia = axis_ix.get(axis)
                    if ia is not None:
                        axes.append(ia)
                    else:
                        axes.append(tuple((ref(d), s, n) for d, s, n in axis))
                template = tuple(axes)
            outs.append((template, om.facts))
        merges, states = [], []
        for r, k in root_ix.items():
            top = r.find()
            if top is not r:
                merges.append((k, ref(top)))
                continue
            now = D.state_of(r)
            before = self.snaps[r]
            if now != before:
                alias = now.alias
                if alias is before.alias:
                    spec: object = _KEEP
                elif alias is None:
                    spec = None
                else:
                    spec = (ref(alias[0]), alias[1], alias[2])
                states.append((k, now._replace(alias=spec)))
        made = []
        k = 0
        while k < len(news):
            d = news[k]
            parent = ref(d.parent) if d.parent is not None else None
            alias = d.alias
            spec = (ref(alias[0]), alias[1], alias[2]) if alias is not None else None
            made.append((d.size, parent, D.state_of(d)._replace(alias=spec)))
            k += 1
        changes = []
        for i, m in enumerate(metas):
            facts, dims = self.meta_snaps[i]
            if m.dims is not dims or m.tags != facts.tags:
                raise Outside
            now = m.facts
            if now != facts:
                changes.append((i, now))
        return _compact(self.paths, made, merges, states, changes, outs)


def _compact(paths: list, made, merges, states, changes, outs) -> Effects:
    """The effects with only the paths they use (a template that reuses its inputs' axes
    whole needs none), references renumbered."""
    base = len(paths)
    used: set[int] = set()

    def use(k) -> None:
        while k is not None and k < base and k not in used:
            used.add(k)
            p = paths[k]
            k = p[1] if p[0] == 2 else None

    def alias_refs(state):
        alias = state.alias
        return () if alias is None or alias == _KEEP else (alias[0],)

    for template, _ in outs:
        if type(template) is not int:
            for t in template:
                if not (t and type(t[0]) is int):
                    for r, _, _ in t:
                        use(r)
    for root, parent in merges:
        use(root)
        use(parent)
    for root, state in states:
        use(root)
        for r in alias_refs(state):
            use(r)
    for _, parent, state in made:
        use(parent)
        for r in alias_refs(state):
            use(r)
    order = sorted(used)
    new = {k: i for i, k in enumerate(order)}
    shift = len(order) - base

    def ref(k):
        if k is None:
            return None
        return new[k] if k < base else k + shift

    def state_of(state):
        alias = state.alias
        if alias is None or alias == _KEEP:
            return state
        return state._replace(alias=(ref(alias[0]), alias[1], alias[2]))

    kept = tuple((2, new[p[1]]) if p[0] == 2 else p for p in (paths[k] for k in order))
    return Effects(
        kept,
        tuple((size, ref(parent), state_of(state)) for size, parent, state in made),
        tuple((ref(root), ref(parent)) for root, parent in merges),
        tuple((ref(root), state_of(state)) for root, state in states),
        tuple(changes),
        tuple(
            (
                template
                if type(template) is int
                else tuple(
                    t if t and type(t[0]) is int else tuple((ref(r), s, n) for r, s, n in t)
                    for t in template
                ),
                fields,
            )
            for template, fields in outs
        ),
    )


def resolve(paths: tuple, metas: list) -> list:
    """The dims `paths` find in `metas` (raises when the inputs do not have them)."""
    objs: list = []
    append = objs.append
    for p in paths:
        c = p[0]
        if c == 0:
            append(metas[p[1]].dims[p[2]][p[3]][0])
        elif c == 1:
            append(metas[p[1]].dims[p[2]][p[3]][0].find())
        else:
            append(objs[p[1]].alias[0].find())
    return objs


def _set_state(dim, state, objs: list) -> None:
    """Give `dim` a recorded `DimState`, its alias resolved in `objs` (or kept)."""
    alias = state.alias
    if alias is _KEEP:
        state = state._replace(alias=dim.alias)
    elif alias is not None:
        state = state._replace(alias=(objs[alias[0]], alias[1], alias[2]))
    D.restore(dim, state)


def apply(effects: Effects, objs: list | None, metas: list, made) -> None:
    """Make the step's effects on the dims `objs` (resolved from its inputs), and fill in
    `made`, its outputs' metas (made with their slots only: `owed.pending`)."""
    if effects.simple:
        outputs(effects.templates, objs, metas, made)
        return
    if objs is None:
        objs = []
    news = effects.news
    if news:
        dims = [D.Dim(size) for size, _, _ in news]
        objs.extend(dims)
        for dim, (_, parent, state) in zip(dims, news, strict=True):
            if parent is not None:
                dim.parent = objs[parent]
            _set_state(dim, state, objs)
    changed = bool(news)
    for root, parent in effects.merges:
        objs[root].parent = objs[parent]
        changed = True
    for root, state in effects.states:
        _set_state(objs[root], state, objs)
        changed = True
    for i, facts in effects.changes:
        metas[i].facts = facts
        changed = True
    if changed:
        D.names_changed()
    outputs(effects.templates, objs, metas, made)


def outputs(templates: tuple, objs: list | None, metas: list, made) -> None:
    """Fill in the outputs' metas of a step (`apply`)."""
    for (template, facts), meta in zip(templates, made, strict=True):
        meta.fill(build(template, metas, objs), facts)


def build(template, metas: list, objs: list | None) -> tuple:
    """An output's dims from its template (`Capture.end`): an input's dims whole (its
    index), else per axis an input's axis (`(input, axis)`) or atoms of the dims in `objs`
    (`((object index, stride, size), ...)`)."""
    if type(template) is int:
        return metas[template].dims
    return tuple(
        metas[t[0]].dims[t[1]]
        if t and type(t[0]) is int
        else tuple([(objs[r], stride, size) for r, stride, size in t])  # type: ignore[index]
        for t in template
    )


# -- recordings --------------------------------------------------------------------------------
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


_by_module: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_by_key: dict = {}


def active() -> bool:
    """Whether sessions replay: `SHAPEGUARD_REPLAY=0` turns it off (read per session)."""
    return os.environ.get("SHAPEGUARD_REPLAY", "1").strip().lower() not in _OFF


_OFF = ("0", "false", "off", "no")


def opener(kind: str, owner) -> _Opener | None:
    """The record of sessions opened by `owner` (a module, or a hashable key); None when
    there is none or replay is off."""
    if owner is None or not active():
        return None
    if isinstance(owner, torch.nn.Module):
        try:
            table = _by_module.get(owner)
            if table is None:
                table = _by_module[owner] = {}
        except TypeError:
            return None
        key: object = kind
    else:
        table = _by_key
        key = (kind, owner)
        if key not in table and len(table) >= _MAX_OPENERS:
            table.clear()
    found = table.get(key)
    if found is None:
        found = table[key] = _Opener()
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
