"""Comparing a call with a recorded step (`_trace/replay.py`): its arguments besides
tensors, its tensor inputs (which step made each, of what shape and dtype; a tensor first
seen by its kind), the tensor values a rule read. `compare` is the plain comparison;
`matcher` the same in generated code, kept for its measured gain (see its docstring).
"""

import weakref
from typing import TYPE_CHECKING

import torch
from torch.overrides import TorchFunctionMode

from .. import _ops
from .._memo import Memo

if TYPE_CHECKING:
    from .replay import Step


class Unkeyable(Exception):
    """An argument whose equality says nothing (or that holds tensors out of reach)."""


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
        make = _matchers.put(
            shape_key, _compile_matcher(count, names, checks, where_tensors, unseen)
        )
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


# By the form of a step's arguments: a model has a few dozen forms, hence the bound.
_matchers = Memo("replay matchers", 4096)


def _compile_matcher(count: int, names: tuple, checks: tuple, where_tensors: list, unseen):
    """The straight code of a matcher for steps of this form: 3.0-4.5 us a step where
    `compare` takes 7.3-8.2 us (`matcher` says how it was measured and tested)."""

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
