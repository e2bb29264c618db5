"""The interceptor: one TorchFunctionMode plus global module hooks, for one trace.

A session is opened by `trace()` or by the first guarded module to run, and is
closed, whatever happens, by the same party. While it is open every torch
function, Tensor method and operator call in this thread goes through
`Session.dispatch`: the op's checker runs first (so shape bugs are reported
before torch raises), then the op, then its output is named and recorded.
"""

import dataclasses
import inspect
import typing
import weakref
from sys import _getframe

import torch
from torch._C import _pop_torch_function_stack, _push_on_torch_function_stack
from torch.overrides import TorchFunctionMode

from .. import _config, _ops, _reporting, _source, _tp
from .. import checks as _checks
from .._errors import Context, ShapeError, Violation
from .._names import axes as _axes
from .._names import dims as _dims
from .._names import flow as _flow
from .._names import roots as _roots
from . import composites as _composites
from . import construction as _construction
from . import flash as _flash
from . import internal as _internal
from . import owed as _owed
from . import replay as _replay
from . import tp_session as _tp_session
from .call import OpCall, dtype_name
from .current import _local, current_session
from .meta import (
    FRESH,
    FRESH_PARAM,
    NO_FLAGS,
    Facts,
    TensorMeta,
    TensorTable,
    buffer_name,
    buffer_origin,
    role_for,
)
from .observe import Observation, Observer
from .record import TraceData as Trace

_QUERY = _ops.QUERY
_site_epoch = _source.site_epoch
_Tensor = torch.Tensor
_SEQUENCES = (tuple, list)
_torch_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_dispatch_mode = torch._C._get_dispatch_mode
_PROXY, _FAKE = torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FAKE


def _not_running() -> bool:
    """Whether torch transforms or traces the ops instead of running them: a functorch
    transform (vmap, grad, jvp: flex_attention's block masks are made under vmap), or
    make_fx / export tracing (a proxy mode, fake tensors with symbolic sizes). shapeguard
    steps aside there: a rule's read of a value fails (`.item()` under vmap) or is traced
    into the graph, and comparing a symbolic size with a number specializes it. Asked on the
    paths that check or record an op, not on the replay's hot path (a replayed step matches
    only tensors that shapeguard recorded, and they are never recorded here)."""
    return (
        _transforms_active()
        or _dispatch_mode(_PROXY) is not None
        or _dispatch_mode(_FAKE) is not None
    )


def _is_compiling() -> bool:
    """Whether dynamo is tracing (not while shapeguard checks a compiled module eagerly:
    `_compiled.check`)."""
    return _torch_compiling() and not getattr(_local, "eager", False)


def _static(tensor, meta: TensorMeta | None = None) -> tuple:
    """What an event keeps of a tensor besides its meta: torch.Size holds ints, never the
    tensor; of a DTensor also its placements and local shape (`_tp_session.record_sharding`,
    which gives its local shard the DTensor's axes when the meta is known). One tuple
    shared by the events of tensors alike (`_shared`)."""
    dtype = tensor.dtype
    device = "cpu" if tensor.is_cpu else "meta" if tensor.is_meta else tensor.device.type
    facts = _DTYPE_FACTS.get(dtype)
    if facts is None:
        facts = _DTYPE_FACTS[dtype] = (dtype_name(dtype), dtype.itemsize)
    if type(tensor) is not torch.Tensor and _tp.is_dtensor(tensor):
        sharded = _tp_session.record_sharding(tensor, meta, current_session())
        return tensor.shape, facts[0], device, facts[1], sharded
    return _shared((tensor.shape, facts[0], device, facts[1]))


# (name, item size) by dtype: two reads of every tensor an event keeps, made once per dtype.
_DTYPE_FACTS: dict = {}
# Tuples events keep, one of each value (`_shared`): the collector tracks every tuple and
# torch.Size an event keeps, and a run makes a full collection per some 70,000 of them
# kept (the 3.11 collector counts objects made and not yet freed), so a traced test or
# training loop that kept four per tensor of each op paid for several more. Ops repeat
# their shapes and signatures: one tuple each, bounded.
_SHARED: dict = {}


def _shared(value: tuple) -> tuple:
    """`value`, or the equal tuple an event already keeps: a tensor's static part
    (`_static`), or the tuple of an op's inputs' or outputs' ones. An unhashable one (a
    symbolic size, a DTensor's sharding) is its own."""
    try:
        found = _SHARED.get(value)
    except TypeError:
        return value
    if found is None:
        if len(_SHARED) > 8192:
            _SHARED.clear()
        found = _SHARED[value] = value
    return found


_ENTER, _EXIT = _replay.ENTER, _replay.EXIT
_MISSED = object()  # a replayed op that was not the recording's next step
_UNSET = object()  # the innermost module, not looked up yet
_GENERIC = _replay.GENERIC
_OWED = object()  # a replayed step's objects: not resolved, its effects owed (`_owed`)
_CHECK = object()  # a replayed step run on the reference path instead (`_check_op`)

# (spelling, op) by the function torch hands the mode: two lookups made once per function.
_SPECS: dict = {}


def _spec_of(func) -> tuple:
    """(op, spec) of `func`, from `_SPECS` when known (the interceptor inlines that lookup
    and calls this on a miss only)."""
    try:
        known = _SPECS.get(func)
    except TypeError:  # an unhashable callable
        known = None
    if known is not None:
        return known
    op = _ops.name_of(func)
    found = (op, _ops.lookup(op))
    try:
        if len(_SPECS) > 4096:
            _SPECS.clear()
        _SPECS[func] = found
    except TypeError:  # an unhashable callable
        pass
    return found


class _Closed:
    """What a closed session's mode holds instead of it: every call goes through."""

    observers = ()
    _dispatching = True


_CLOSED = _Closed()


class _Interceptor(TorchFunctionMode):
    shapeguard_interceptor = True  # how `_composites` tells ours from other modes

    def __init__(self, session: "Session") -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Session.dispatch, inlined: one frame less on every call torch makes.
        __tracebackhide__ = True
        session = self.session
        if kwargs is None:
            kwargs = {}
        try:
            found = _SPECS.get(func)
        except TypeError:  # an unhashable callable
            found = None
        if found is None:
            found = _spec_of(func)
        op, spec = found
        if session.observers:  # the one test an unobserved session pays (`Session.observe`)
            return session._observed(func, op, spec, args, kwargs)
        if (
            spec.family == _QUERY
            or session._dispatching
            or (_torch_compiling() and not getattr(_local, "eager", False))
            or getattr(_local, "session", None) is not session
            or not session.enabled
            or _config._disabled_by_api
        ):
            return func(*args, **kwargs)
        session._dispatching = True
        try:
            if session.replay is not None:
                out = session._replay_op(func, op, spec, args, kwargs)
                if out is not _MISSED:
                    return out
            return session._dispatch(func, op, spec, args, kwargs)
        finally:
            session._dispatching = False


class Session:
    """The live side of a Trace: mode, hooks, module stack and tensor names."""

    def __init__(self, trace: Trace, root, opener=None) -> None:
        self.trace = trace
        self._root = _weak(root) if root is not None else None
        self.owner = None  # the guarded module that opened this session, if any
        self.background = trace.background
        self.owner_depth = 0
        self.metas = TensorTable()
        self._state_names: dict[int, str] | None = None
        self.module_stack: list = []
        self._paths: dict[int, str] | None = None
        self._seen_modules: set[int] = set()
        self._declared: dict[int, dict[str, tuple[str, int]]] = {}
        self._warned: set[tuple[str, str]] = set()
        self._mode = _Interceptor(self)
        self._handles: list = []
        self._dispatching = False
        self._previous: Session | None = None
        # The background session (the pytest plugin's) whose mode this one took off the
        # stack while it is open (`_lift`), to push back on close.
        self._lifted: Session | None = None
        self._flash_held = False  # this session holds a wrap of flash-attn's entry points
        # The off switch, read when the session opens and when a forward starts (the root
        # module entered), not per op; `disable()` is seen at once.
        self.enabled = True
        # Replay (see `_replay`): who opened the session, the steps of an earlier session of
        # that opener being followed, the steps this one records, and the index of the next.
        self._opener = None if trace.background else opener
        self.replay: list | None = None
        self._choices: list = []
        self.recorder: list | None = None
        self.step = 0
        self.replayed = 0  # steps replayed (the trace sums them: `Trace._replayed`)
        # `SHAPEGUARD_REPLAY=check`: each step a replay matches runs the reference path,
        # whose step (`_append`) must be `_expected`, the one the replay matched.
        self._checking = False
        self._expected = None
        self._fresh = 0  # tensors made outside the trace, numbered as first seen (negative)
        # The replayed steps whose effects are made when first read (`_owed`).
        self.ledger = _owed.Ledger()
        # What `observe` registered: told of every op the mode is handed (empty: none).
        self.observers: tuple = ()
        # Set once torch.distributed reduce-scatters a tensor: the user's elementwise ops
        # and transposes then carry the axis it split (`_tp_session.carry`).
        self.tp_split = False

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._on_module_enter),
            hooks.register_module_forward_hook(self._on_module_exit, always_call=True),
        ]
        previous = current_session()
        self._lifted = _lift(previous)
        try:
            self._mode.__enter__()
        except BaseException:
            self._restore_lifted()
            self._remove_hooks()
            raise
        self._previous = previous
        _local.session = self
        self.trace._live += 1
        self._flash_held = _flash.patch()
        self.enabled = _config.is_enabled()
        opener = self._opener
        if opener is not None:
            self._checking = _replay.checking()
            if self._checking:
                self.ledger.pay()  # (nothing owed: the reference path makes every step)
            if opener.recordings:
                self._choices = [r.steps for r in opener.recordings]
                self.replay = self._choices[0]
            elif opener.sessions:
                self.recorder = []  # the second session of an opener: the first recorded
            opener.sessions += 1

    def close(self) -> None:
        # First, so flash-attn's functions are restored whatever fails below (it never raises).
        held, self._flash_held = self._flash_held, False
        _flash.restore(held)
        self._stop_recording()
        self.replay = None
        self.trace._replayed += self.replayed
        self.trace._steps += self.step
        if not self.ledger.paid and self.ledger.steps:
            self.trace._ledgers.append(self.ledger)  # its events' metas: paid when read
        try:
            _composites.release(self)  # a composite's suspended modes, before ours is popped
            # Dynamo's trace, into which `_compiled.check` runs a forward, can leave the
            # stack without our mode when an error unwinds through it: nothing to pop then
            # (and never another's mode: a lifted background session's is not there).
            if _composites.top_mode() is self._mode:
                self._mode.__exit__(None, None, None)
        finally:
            self._remove_hooks()
            self._restore_lifted()
            if getattr(_local, "session", None) is self:
                _local.session = self._previous
            previous, self._previous = self._previous, None
            if previous is not None and previous.background:
                previous.trace.findings.extend(self.trace.findings)
                for failure in self.trace.internal_errors:
                    previous.trace.add_internal(dataclasses.replace(failure))
            self.trace._live -= 1
            if not self.trace._live:
                self.trace.settle()
            self.metas = TensorTable()
            self.module_stack.clear()
            # The mode and the session hold each other: a cycle that only the garbage
            # collector would free, with the trace's events and metas hanging off it (some
            # hundred objects per forward). A mode left on a stack lets every call through.
            self._mode.session = typing.cast("Session", _CLOSED)

    def _restore_lifted(self) -> None:
        lifted, self._lifted = self._lifted, None
        if lifted is not None and lifted._mode.session is lifted:  # still open
            _push_on_torch_function_stack(lifted._mode)

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- modules -----------------------------------------------------------------
    @property
    def root(self):
        """The module the trace started from: given, or the first one a block entered (held
        weakly: a model the user drops inside a long block, or a test under the pytest
        plugin, is collected)."""
        ref = self._root
        return ref() if ref is not None else None

    def _on_module_enter(self, module, args) -> None:
        if getattr(_local, "session", None) is not self:
            return  # an inner session is tracking modules now
        stack = self.module_stack
        replay = self.replay
        if stack and replay is not None and not _torch_compiling():
            # A module entered inside a replayed forward, not the root: `enter_module` and
            # `_replay_enter` inlined (one call per module entered, not three). The stack
            # holds the root, so the root is alive.
            i = self.step
            step = replay[i] if i < len(replay) else None
            if (
                step is not None
                and step.kind == _ENTER
                and not step.root
                and step.first != (id(module) in self._seen_modules)
                and step.module() is module
            ):
                stack.append(module)
                if step.first:
                    self._seen_modules.add(id(module))
                    self.trace.modules_seen += 1
                self.step = i + 1
                self.replayed += 1
                return
        if self.root is None:
            # The first module, or the first since the last root was dropped: paths and
            # state names are read from this one.
            self._root = _weak(module)
            self._paths = self._state_names = None
        self.enter_module(module, args, {})

    def _on_module_exit(self, module, args, output) -> None:
        try:
            _composites.leave(self, module, output)  # whichever session is current
        except Exception as error:
            if not _internal.contained(self.trace, error, "leaving a composite", _class(module)):
                raise
        if getattr(_local, "session", None) is self:
            stack = self.module_stack
            replay = self.replay
            if replay is not None and stack and stack[-1] is module:
                # `exit_module` of a replayed exit from the innermost module, inlined.
                i = self.step
                step = replay[i] if i < len(replay) else None
                if step is not None and step.kind == _EXIT and step.module() is module:
                    self.replayed += 1
                    self.step = i + 1
                    del stack[-1]
                    return
            self.exit_module(module)

    def enter_module(self, module, args: tuple, kwargs: dict) -> None:
        if _is_compiling():
            return
        if _not_running():
            return  # a module run under vmap or make_fx: its ops go through (`_dispatch`)
        try:
            first = not self.module_stack
            if first:
                self.enabled = _config.is_enabled()  # once per forward, not per op
                self.trace._forward += 1
                if len(self.ledger.steps) > _owed.MAX_OWED:
                    self.ledger.pay()
            if self.replay is not None and self._replay_enter(module, first, args, kwargs):
                return
            recorder = self.recorder
            findings = len(self.trace.findings)
            self.module_stack.append(module)
            key = id(module)
            new = key not in self._seen_modules
            if new:
                self._seen_modules.add(key)
                self.trace.modules_seen += 1
                _construction.check_entered(self, module)  # head counts, before its first op
            step = None
            if recorder is not None or self._expected is not None:
                step = _replay.Step(_replay.ENTER)
                step.module = _weak(module)
                step.first = new
                step.root = first
            if first:
                self._name_inputs(module, args, kwargs, step)
            _composites.enter(self, module, args, kwargs)
            if self.recorder is not None or self._expected is not None:
                clean = len(self.trace.findings) == findings and not _composites.suspended(self)
                if not clean:
                    self._append(None, _replay.Why.SUSPENDED)
                elif step is None or step.kind != _replay.ENTER:
                    self._append(None, step.why if step is not None else _replay.Why.OUTSIDE)
                else:
                    self._append(step)
            self.step += 1
        except Exception as error:
            if not _internal.contained(self.trace, error, "entering a module", _class(module)):
                raise
            self._abandon_replay()

    def exit_module(self, module) -> None:
        stack = self.module_stack
        if (
            (not stack or stack[-1] is not module)
            and _not_running()
            and not any(m is module for m in stack)
        ):
            return  # entered under vmap or make_fx, so never entered (`enter_module`)
        try:
            replayed = False
            if self.replay is not None:
                steps, i = self.replay, self.step
                step = steps[i] if i < len(steps) else None
                if step is not None and step.kind == _replay.EXIT and step.module() is module:
                    replayed = True
                    self.replayed += 1
                else:
                    self._diverge(_replay.Why.OTHER_EXIT)
            if not replayed and self.recorder is not None:
                step = _replay.Step(_replay.EXIT)
                step.module = _weak(module)
                self._append(step)
        except Exception as error:
            if not _internal.contained(self.trace, error, "leaving a module", _class(module)):
                raise
            self._abandon_replay()
        self.step += 1
        if stack and stack[-1] is module:
            del stack[-1]  # the innermost module: the usual case
            return
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is module:
                del stack[i:]
                return

    def _input_tensors(self, module, args: tuple, kwargs: dict) -> list:
        names = _parameter_names(type(module))
        tensors = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
        tensors += list(kwargs.items())
        return [leaf for name, value in tensors for leaf in _nested_tensors(name, value)]

    def _name_inputs(self, module, args: tuple, kwargs: dict, step=None) -> None:
        """The root's inputs: parameter names as labels, axes by the usual layouts."""
        tensors = self._input_tensors(module, args, kwargs)
        capture = None
        if step is not None:
            # What a replay compares: the inputs' names, and what each one is.
            plain = [t for _, t in tensors]
            self._describe_inputs(step, plain)
            step.args = tuple(name for name, _ in tensors)
            capture = _replay.Capture([self.meta_of(t) for t in plain])
        declared = self.declared_sizes(module)
        mains, masks = [], []
        try:
            for name, tensor in tensors:
                meta = self.meta_of(tensor)
                if meta.label is None:
                    meta.label, meta.role = name, role_for(name, None)
                if tensor.dtype == torch.bool or meta.role == "mask":
                    masks.append(meta)
                else:
                    _roots.claim_input(meta.dims, tensor, name, declared)
                    mains.append((tensor, meta))
            _roots.pair_sequences(mains)
            for meta in masks:
                main = mains[0][1].dims if mains else ()
                _roots.guess_mask(meta.dims, main)
                _roots.mask_batch(meta.dims, main)
        except BaseException:
            if capture is not None:
                capture.abandon()
            raise
        if capture is not None:
            try:
                step.effects = capture.end([])
            except _replay.Outside:
                step.kind = _replay.BARRIER
                step.why = _replay.Why.OUTSIDE

    # -- replay --------------------------------------------------------------------
    def _append(self, step, why: str = "") -> None:
        """Record a step (None: a barrier, for `why`, after which this session records
        nothing more). Checking a replay, compare it with the step the replay matched."""
        expected = self._expected
        if expected is not None:
            self._expected = None
            if step is not None and step.kind == _replay.OP and step.outputs != expected.outputs:
                # Output shapes the inputs do not decide: a replay steps aside after the op
                # (`_replay_op`), and so does its check.
                self._diverge(_replay.Why.OTHER_OUTPUTS)
                self._append(None, _replay.Why.OTHER_OUTPUTS)
                return
            _replay.check(expected, step, why, step.event[0] if step and step.event else "")
            return
        recorder = self.recorder
        if recorder is None:  # recording stopped at a barrier already
            return
        if step is None:
            recorder.append(_replay.barrier(why))
            self._stop_recording()
        else:
            recorder.append(step)

    def _stop_recording(self) -> None:
        recorder, self.recorder = self.recorder, None
        if recorder is not None and self._opener is not None:
            _replay.remember(self._opener, recorder)

    def _diverge(self, why: str) -> None:
        """This session's step differs from the recording's, for `why`: run it, and the
        rest, as usual (recording them after the replayed ones, unless the recording stopped
        here too). The trace counts the reason (`replay_stops`)."""
        # What runs from here reads and writes metas as usual: make the deferred steps.
        self.ledger.pay()
        steps, self.replay = self.replay, None
        self._choices = []
        i = self.step
        if steps is None:
            return
        barrier = i < len(steps) and steps[i].kind == _replay.BARRIER
        if i >= len(steps):
            why = _replay.Why.ENDED
        elif barrier:
            why = "recorded: " + steps[i].why
        self.trace.replay_stops[why] += 1
        if self._opener is None or barrier:
            return  # (a barrier: the recording says the same, nothing to learn)
        self.recorder = list(steps[:i])

    def _describe_inputs(self, step, tensors: list) -> None:
        """The inputs as a replay compares them (`_replay.Step`)."""
        table = self.metas
        inputs, firsts = [], []
        for t in tensors:
            m = table.get(t)
            inputs.append((m.slot if m is not None else None, t.shape, t.dtype))
            if m is None:
                try:
                    ref = weakref.ref(t)
                except TypeError:
                    ref = None
                firsts.append((ref, self._first_seen(t)))
        step.inputs = tuple(inputs)
        step.firsts = tuple(firsts)

    def _first_seen(self, tensor) -> tuple:
        """What tells a tensor first seen in a step from another: a parameter or buffer of
        the root by its name, any other by its layout (strides, device) and kind."""
        try:
            strides = tensor.stride()
        except RuntimeError:  # sparse and nested tensors
            strides = None
        name = self._state_name(tensor)
        buffer = "" if name else buffer_name(tensor, self.module_stack)
        return (type(tensor), name, buffer, strides, tensor.device.type, tensor.requires_grad)

    def _match_inputs(self, step, tensors: list) -> list | None:
        """The inputs' metas when they are the step's (None for a tensor first seen here)."""
        inputs = step.inputs
        if len(tensors) != len(inputs):
            return None
        table = self.metas
        metas = []
        for t, (slot, shape, dtype) in zip(tensors, inputs, strict=True):
            # Which tensor before what shape (`_same_firsts`: never a symbolic size compared).
            m = table.get(t)
            if slot is None:
                if m is not None:
                    return None
            elif m is None or m.slot != slot or t.dtype is not dtype or t.shape != shape:
                return None
            metas.append(m)
        return metas if self._same_firsts(step, tensors, metas) else None

    def _resolve(self, step, tensors: list | None, metas: list) -> list | None:
        """Give tensors first seen here their metas, and find the dims the step's template
        needs; None (and nothing made) when they are not there."""
        tensors = tensors or []  # (given whenever the step has inputs first seen here)
        made = [k for k, m in enumerate(metas) if m is None] if step.firsts else ()
        fresh = self._fresh
        firsts = iter(step.firsts)
        table = self.metas
        for k in made:
            # The state name recorded: the replay checked that it is that tensor, or one
            # of that name (`_same_firsts`), so it need not be looked up again.
            nature = next(firsts)[1]
            tensor = tensors[k]
            metas[k] = table.get(tensor) or self._replayed_fresh(tensor, nature)
        try:
            paths = step.effects.paths
            return _replay.resolve(paths, metas) if paths else []
        except (IndexError, AttributeError, TypeError):
            for k in made:
                self.metas.discard(tensors[k])
            self._fresh = fresh
            return None

    def _replayed_fresh(self, tensor, nature: tuple) -> TensorMeta:
        """`_fresh_meta` for a tensor first seen in a replayed step, whose `_first_seen`
        is `nature`: the same axes, origins and slot (`_owed.fill_fresh`)."""
        self._fresh -= 1
        meta = _owed.pending(self._fresh, None)
        _owed.fill_fresh(meta, tensor.shape, nature)
        self.metas[tensor] = meta
        return meta

    def _owe_firsts(self, step, tensors: list | None, metas: list) -> None:
        """Pending metas for the tensors first seen in a deferred step, numbered as
        `_replayed_fresh` numbers them (`_owed.Ledger.pay` gives them their axes)."""
        tensors = tensors or []  # (given whenever the step has inputs first seen here)
        table = self.metas
        owed = self.ledger.ref
        for k, m in enumerate(metas):
            if m is None:
                tensor = tensors[k]
                m = table.get(tensor)  # the same tensor given twice
                if m is None:
                    self._fresh -= 1
                    m = table[tensor] = _owed.pending(self._fresh, owed)
                metas[k] = m

    def _replay_enter(self, module, first: bool, args: tuple, kwargs: dict) -> bool:
        seen = id(module) in self._seen_modules
        i = self.step
        tensors = names = None
        # The recordings this step may follow: the current one, or at the first step any
        # recorded way the opener's sessions started.
        choices: list | tuple = (
            self._choices if i == 0 and len(self._choices) > 1 else (self.replay,)
        )
        for steps in choices:
            step = steps[i] if i < len(steps) else None
            if (
                step is None
                or step.kind != _replay.ENTER
                or step.root != first
                or step.first == seen
                or step.module() is not module
            ):
                continue
            objs = metas = None
            if first:
                if tensors is None:
                    named = self._input_tensors(module, args, kwargs)
                    tensors = [t for _, t in named]
                    names = tuple(name for name, _ in named)
                if names != step.args:
                    continue
                metas = self._match_inputs(step, tensors)
                if metas is None:
                    continue
                if self._checking:
                    # The reference path names the inputs; `_append` compares its step.
                    self._expected = step
                    self.replay = steps
                    self.replayed += 1
                    return False
                if self.ledger.paid:
                    objs = self._resolve(step, tensors, metas)
                    if objs is None:
                        continue
            self.replay = steps
            self.module_stack.append(module)
            if step.first:
                self._seen_modules.add(id(module))
                self.trace.modules_seen += 1
            if first and metas is not None and tensors is not None:
                ledger = self.ledger
                if objs is not None:
                    _replay.apply(step.effects, objs, metas, ())
                else:
                    self._owe_firsts(step, tensors, metas)
                    ledger.steps.append(step)
                    ledger.metas.append(tuple(metas))
            self.step += 1
            self.replayed += 1
            return True
        self._diverge(_replay.Why.OTHER_START if i == 0 else _replay.Why.OTHER_ENTER)
        return False

    def meta_of(self, tensor) -> TensorMeta:
        """The meta of `tensor`; one first seen here (a tensor made outside the trace, a
        parameter) gets new axes of its own."""
        meta = self.metas.get(tensor)
        if meta is None and type(tensor) is not torch.Tensor and _tp.is_dtensor(tensor):
            meta = _tp_session.dtensor_meta(self, tensor)  # from_local made it: its shard's axes
            if meta is not None:
                self.metas[tensor] = meta
        if meta is None:
            meta = self._fresh_meta(tensor, self._state_name(tensor))
        return meta

    def _fresh_meta(self, tensor, name: str) -> TensorMeta:
        """New axes for a tensor first seen here, `name` its state name (or "")."""
        if not isinstance(tensor, _Tensor):
            # A caller (a rule) took a non-tensor for a tensor: its bug, contained where
            # it runs (`_internal`) and loud in shapeguard's own suite.
            raise TypeError(f"shapeguard asked for the axes of a {type(tensor).__name__}")
        param = isinstance(tensor, torch.nn.Parameter)
        origin = "a parameter" if param else "a tensor made outside the trace"
        axes = _dims.fresh_axes(tuple(tensor.shape))
        for i, axis in enumerate(axes):
            for dim, _, _ in axis:
                dim.origin = f"axis {i} of {name}" if name else origin
        meta = TensorMeta.made(axes, FRESH_PARAM if param else FRESH, 0)
        self._fresh -= 1
        meta.slot = self._fresh
        self.metas[tensor] = meta
        return meta

    def _state_name(self, tensor) -> str:
        """The qualified name of a parameter or buffer of the root module (for messages)."""
        if self._state_names is None:
            root = self.root
            self._state_names = {}
            if root is not None and hasattr(root, "named_parameters"):
                for name, value in (*root.named_parameters(), *root.named_buffers()):
                    self._state_names[id(value)] = name
        return self._state_names.get(id(tensor), "")

    def declared_sizes(self, module) -> dict[str, tuple[str, int]]:
        """`_axes.declared_sizes`, read once per module per session."""
        key = id(module)
        found = self._declared.get(key)
        if found is None:
            found = _axes.declared_sizes(module)
            if found and _tp.dtensor_class() is not None:
                found = _tp_session.local_sizes(
                    self, module, found
                )  # a TP shard's local head counts
            self._declared[key] = found
        return found

    def module_path(self, module) -> str:
        if self._paths is None:
            root = self.root
            self._paths = (
                {id(m): name for name, m in root.named_modules()} if root is not None else {}
            )
        return self._paths.get(id(module), "")

    def described_module(self):
        """The innermost module a record is attributed to: the innermost one on the stack
        that belongs to the root's tree. A module object called inside the tree without
        being registered in it (the `kernels` package's `Func` wrapping transformers'
        `apply_rotary_pos_emb`, kept in a plain dict) is a function call of its caller, as
        it would be without the wrapper; outside any tree module, it stands for itself."""
        stack = self.module_stack
        module = stack[-1]
        if self.module_path(module) or module is self.root or len(stack) == 1:
            return module
        paths = self._paths or {}
        for outer in reversed(stack):
            if id(outer) in paths:
                return outer
        return module

    def module_description(self) -> tuple[str, str, str]:
        """(path, class name, "path (Class)") of the innermost module."""
        if not self.module_stack:
            return "", "", ""
        module = self.described_module()
        path = self.module_path(module)
        cls = type(module).__name__
        return path, cls, f"{path} ({cls})" if path else cls

    # -- observers -----------------------------------------------------------------
    def observe(self, observer: Observer) -> Observation:
        """Tell `observer` of every op this session's mode is handed, until the returned
        handle is closed (it is a context manager, closed however its block ends).

        An observed session neither replays nor records for a later replay (an observer
        needs every op run, and its composites run unsuspended: see `_observed`), also
        after the observer is gone."""
        self.ledger.pay()
        if self.replay is not None:
            self.trace.replay_stops[_replay.Why.OBSERVED] += 1
        self.replay = None
        self._choices = []
        self.recorder = None  # dropped, not remembered: the steps so far are not a recording
        self._opener = None
        self.observers = (*self.observers, observer)
        _composites.observed(self)
        return Observation(self, observer)

    def _observed(self, func, op: str, spec, args: tuple, kwargs: dict):
        """The interceptor's path while observers are registered: each is told before and
        after the op, which runs as `dispatch` runs it (checked, recorded when checks are on;
        as it is when off: observers see the ops of an unchecked forward too). Their own
        torch calls go through unrecorded, as checkers' do. A composite is not suspended in
        an observed session (`_composites.enter`), so observers see its ops one by one."""
        __tracebackhide__ = True
        if spec.family == _QUERY or _not_running():
            return func(*args, **kwargs)  # (under vmap no observer may read a value)
        observers = self.observers
        count = len(self.trace.events)
        quiet = self._dispatching
        self._dispatching = True
        try:
            for observer in observers:
                observer.before(func, op, args, kwargs)
        finally:
            self._dispatching = quiet
        if _composites.suspended(self):
            out = func(*args, **kwargs)  # inside a composite this session checks as one call
        else:
            out = self._dispatch_op(func, op, spec, args, kwargs)
        self._dispatching = True
        try:
            for observer in observers:
                observer.after(func, op, args, kwargs, out, count)
        finally:
            self._dispatching = quiet
        return out

    # -- ops ---------------------------------------------------------------------
    def dispatch(self, func, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        op, spec = _spec_of(func)
        return self._dispatch_op(func, op, spec, args, kwargs)

    def _dispatch_op(self, func, op: str, spec, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        if (
            spec.family == _QUERY
            or self._dispatching
            or _is_compiling()
            # An inner session sees this op too (its mode runs first); check it once.
            or getattr(_local, "session", None) is not self
            or not self.enabled
            or _config._disabled_by_api
        ):
            return func(*args, **kwargs)
        self._dispatching = True
        try:
            if self.replay is not None:
                out = self._replay_op(func, op, spec, args, kwargs)
                if out is not _MISSED:
                    return out
            return self._dispatch(func, op, spec, args, kwargs)
        finally:
            self._dispatching = False

    def _replay_op(self, func, op: str, spec, args: tuple, kwargs: dict):
        """Run the op as the recording's next step says, or return _MISSED (nothing done)
        when it is not that step. (Written flat: this is the hot path of a replay.)"""
        __tracebackhide__ = True
        i = self.step
        site = tensors = None
        module = _UNSET
        replay = self.replay
        choices: list | tuple
        if i == 0 and len(self._choices) > 1:
            choices = self._choices
        else:
            choices = (replay,) if replay is not None else ()
        get = self.metas.lookup
        ledger = self.ledger
        checking = self._checking
        plain = False  # the op runs unchecked: its error is torch's, not ours
        why = _replay.Why.OTHER_FUNCTION  # (of the last step compared, when none is this op)
        try:
            for steps in choices:
                step = steps[i] if i < len(steps) else None
                if step is None or (step.func is not func and step.func != func):
                    continue
                if module is _UNSET:
                    # The user's frame, found as `_source.op_site` finds it; its site is looked
                    # up only when the frame is not where the step's site was last seen.
                    found_frame = _source.op_frame(_getframe(2))
                    if found_frame is None:
                        plain = True  # torch.optim's own (`_source.op_site`)
                        return func(*args, **kwargs)
                    frame, in_module = found_frame
                    if frame is None:
                        site = None
                    else:
                        code = frame.f_code
                        lasti = frame.f_lasti
                        where = step.where
                        if (
                            where is not None
                            and where[0] is code
                            and where[1] == lasti
                            and where[2] is in_module
                            and where[3] == _site_epoch[0]
                        ):
                            site = step.site
                        else:
                            site = _source.frame_site(frame, in_module)
                            if site is step.site:
                                step.where = _source.site_key(code, lasti, in_module, site)
                    stack = self.module_stack
                    module = stack[-1] if stack else None
                ref = step.module
                if step.site is not site:
                    why = _replay.Why.OTHER_LINE
                    continue
                if (ref() if ref is not None else None) is not module:
                    why = _replay.Why.OTHER_MODULE
                    continue
                match = step.match
                if match is None:
                    match = step.match = _replay.matcher(step)
                if match:
                    # The arguments and inputs compared in straight code (`_replay.matcher`).
                    found = match(args, kwargs, get)
                    if found is not None and found is not _GENERIC:
                        if step.firsts:
                            metas, tensors = found
                        else:
                            metas = found
                        if not ledger.paid:
                            objs = _OWED  # made when read (`_owed`)
                            break
                        if checking:
                            objs = _CHECK
                            break
                        objs = self._resolve(step, tensors, metas)
                        if objs is None:
                            why = _replay.Why.OTHER_AXES
                            continue
                        break
                if tensors is None:
                    tensors = []  # `OpCall.tensors`, inlined
                    for a in args:
                        if isinstance(a, _Tensor):
                            tensors.append(a)
                        elif isinstance(a, _SEQUENCES):
                            tensors.extend([t for t in a if isinstance(t, _Tensor)])
                    if kwargs:
                        tensors += [v for v in kwargs.values() if isinstance(v, _Tensor)]
                if not _replay.same_args(step.args, args, kwargs):
                    why = _replay.Why.OTHER_ARGUMENTS
                    continue
                inputs = step.inputs
                why = _replay.Why.OTHER_INPUTS
                if len(tensors) != len(inputs):
                    continue
                metas = []
                unseen = False
                for t, (slot, shape, dtype) in zip(tensors, inputs, strict=True):
                    # Which tensor before what shape (`_same_firsts` compares a tensor
                    # first seen here): a fake tensor's symbolic sizes are never compared.
                    entry = get(id(t))
                    m = entry[1] if entry is not None and entry[0]() is t else None
                    if slot is None:
                        if m is not None:
                            break
                        unseen = True
                    elif m is None or m.slot != slot or t.dtype is not dtype or t.shape != shape:
                        break
                    metas.append(m)
                else:
                    if unseen and not self._same_firsts(step, tensors, metas):
                        why = _replay.Why.OTHER_FIRST_SEEN
                        continue
                    why = _replay.Why.OTHER_VALUES
                    if step.values and (
                        # Under vmap no value may be read: a step whose rules read some is
                        # not this op (which `_dispatch` would let through unrecorded).
                        _not_running()
                        or (
                            not all(_replay.same_values(tensors[k], v) for k, v in step.values)
                            and not self._values_pass(func, op, spec, args, kwargs, site)
                        )
                    ):
                        continue
                    if step.extras and not self._match_extras(step.extras):
                        why = _replay.Why.OTHER_FRAME
                        continue
                    if not ledger.paid:  # (`_values_pass` may have paid it)
                        objs = _OWED
                        break
                    if checking:
                        objs = _CHECK
                        break
                    objs = self._resolve(step, tensors, metas)
                    if objs is None:
                        why = _replay.Why.OTHER_AXES
                        continue
                    break
            else:
                if _not_running():
                    plain = True  # never recorded (`_dispatch`): the replay goes on after it
                    return func(*args, **kwargs)
                whose = _source.op_site()
                if whose is _source.OPTIMIZER:
                    plain = True  # torch.optim's own: never recorded either
                    return func(*args, **kwargs)
                self._diverge(_replay.Why.DISTRIBUTED if whose is _source.PLUMBING else why)
                return _MISSED
        except Exception as error:
            if plain or not _internal.contained(self.trace, error, "replaying", op):
                raise
            self._abandon_replay()
            return _MISSED  # run as usual (`_dispatch`)
        self.replay = steps
        if objs is _CHECK:
            return self._check_op(step, func, op, spec, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except ShapeError:
            raise
        except RuntimeError as error:
            if type(error) is not RuntimeError:
                raise  # torch's own kind of failure, kept as it is (as in `_dispatch`)
            explained = self._explain(error, OpCall(self, func, op, args, kwargs, site, spec))
            if explained is None:
                raise
            try:
                raise explained from error
            finally:
                explained = None
        try:
            shapes = step.outputs
            if type(out) is torch.Tensor:
                outputs = None  # the one output: `out`
                same = len(shapes) == 1 and out.shape == shapes[0]
            else:
                outputs = _tensors_of(out)
                same = len(outputs) == len(shapes) and all(
                    o.shape == s for o, s in zip(outputs, shapes, strict=True)
                )
            if not same:
                # Output shapes the inputs' do not decide (nonzero, a boolean index): as usual.
                self._diverge(_replay.Why.OTHER_OUTPUTS)
                self._record(OpCall(self, func, op, args, kwargs, site, spec), out)
                self._append(None, _replay.Why.OTHER_OUTPUTS)
                self.step += 1
                return out
            slot = i * _replay.MAX_OUTPUTS
            if objs is _OWED:
                if step.firsts:
                    self._owe_firsts(step, tensors, metas)
                owed = ledger.ref
            else:
                owed = None
            table = self.metas
            if outputs is None:
                made: list = [_owed.pending(slot + 1, owed)]
                table[out] = made[0]
            else:
                made = [_owed.pending(slot + k, owed) for k in range(1, len(shapes) + 1)]
                for tensor, meta in zip(outputs, made, strict=True):
                    table[tensor] = meta
            both = (*metas, *made)
            if owed is not None:
                ledger.steps.append(step)
                ledger.metas.append(both)
            else:
                _replay.apply(step.effects, typing.cast("list | None", objs), metas, made)
            event = step.event
            if event is not None:
                trace = self.trace
                pending = trace._pending
                if len(trace._events) + len(pending) >= trace.max_events:
                    trace.dropped_events += 1
                else:
                    pending.append((*event, both, None))  # `TraceData.record`
        except Exception as error:
            if not _internal.contained(self.trace, error, "replaying", op, site):
                raise
            self._abandon_replay()
            self.step = i + 1
            return out
        self.step = i + 1
        self.replayed += 1
        return out

    def _check_op(self, step, func, op: str, spec, args: tuple, kwargs: dict):
        """`SHAPEGUARD_REPLAY=check`: run the op on the reference path (`_dispatch`), whose
        step must be `step`, the one the replay matched (`_replay.check` raises otherwise).
        Outputs of other shapes make the replay step aside, as they would replaying."""
        __tracebackhide__ = True
        self._expected = step
        try:
            out = self._dispatch(func, op, spec, args, kwargs)
        finally:
            missed, self._expected = self._expected, None
        if missed is not None:
            raise _replay.ReplayMismatch(
                f"shapeguard: SHAPEGUARD_REPLAY=check: the replay of {op} differs from the "
                "reference path: the reference path records nothing for it"
            )
        if self.replay is not None:  # (not stepped aside: `_append`)
            self.replayed += 1
        return out

    def _same_firsts(self, step, tensors: list, metas: list) -> bool:
        """The tensors first seen here are the recorded ones: the same object (a parameter
        of the same module), or one of the same kind and layout; then of the same dtype and
        shape. Kind first: the sizes of a fake tensor (make_fx, export) are symbolic, and
        comparing one with a number would specialize what torch traces."""
        firsts = iter(step.firsts)
        for t, m, (_, shape, dtype) in zip(tensors, metas, step.inputs, strict=True):
            if m is not None:
                continue
            ref, nature = next(firsts)
            if ref is not None and ref() is t:
                if (t.stride(), t.device.type, t.requires_grad) != nature[3:]:
                    return False
            elif self._first_seen(t) != nature:  # its type first: a FakeTensor stops here
                return False
            if t.dtype is not dtype or t.shape != shape:
                return False
        return True

    def _values_pass(self, func, op: str, spec, args: tuple, kwargs: dict, site) -> bool:
        """A step whose rules read tensor values that differ from the recorded ones (a
        mask of other paddings): run its rules again, on the state the replay made, which
        is the state they saw when recorded. Clean: replay the step (its axes do not depend
        on values); a finding: run it as usual."""
        call = OpCall(self, func, op, args, kwargs, site, spec)
        call.flagged = self._flagged(call)
        call.extras = []  # as when recorded: a rule that reads a tensor first seen
        for rule in _checks.rules_for(op, _checks.distributed_now()):
            if rule.operands and not _checks.applies(rule, args):
                continue
            for _ in rule.check(call):
                return False
        return all(known for _, known in call.extras)  # ... makes it not worth replaying

    def _match_extras(self, extras: tuple) -> bool:
        """The tensors the rules read from the user's frame are the recorded ones."""
        frame = _source.user_frame()
        if frame is None:
            return False
        local = frame.f_locals
        table = self.metas
        for name, slot in extras:
            value = local.get(name)
            meta = table.get(value) if isinstance(value, torch.Tensor) else None
            if meta is None or meta.slot != slot:
                return False
        return True

    def _dispatch(self, func, op: str, spec, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        if _not_running():
            return func(*args, **kwargs)  # vmap, make_fx: never checked nor recorded
        # Failures of shapeguard's own code are contained (`_internal`): before the op, it
        # runs unchecked; in a rule, that rule is skipped; after it, its output is returned.
        call = None
        try:
            site = _source.op_site()
            if site is not _source.PLUMBING and site is not _source.OPTIMIZER:
                call = OpCall(self, func, op, args, kwargs, site, spec)
                upstream: frozenset = NO_FLAGS  # `_flagged`, inlined: once per op
                read = call.meta
                tensors = call.tensors()
                for t in tensors:
                    if t._has_symbolic_sizes_strides:
                        # A fake tensor of symbolic sizes, outside the tracing modes (make_fx
                        # making its inputs): comparing a size would specialize it.
                        call = site = None
                        break
                    known = read(t)
                    if known is not None and known.flagged:
                        upstream = upstream | known.flagged
                else:
                    call.flagged = upstream
                    rules = _checks.rules_for(op, _checks.distributed_now())
                    step = (
                        self._begin_step(call, rules)
                        if self.recorder is not None or self._expected is not None
                        else None
                    )
                    reads = _replay.ValueReads(tensors) if step is not None else None
        except Exception as error:
            if not _internal.contained(self.trace, error, "preparing the checks", op):
                raise
            self._abandon_replay()
            return func(*args, **kwargs)
        if call is None:
            if site is _source.PLUMBING:
                return _tp_session.plumbing(self, func, spec, args, kwargs)
            return func(*args, **kwargs)  # torch.optim's own, symbolic sizes
        broken = None  # the first error warn mode let through
        yielded = False
        if rules:
            here = id(self.module_stack[-1]) if self.module_stack else None
            consequence = False
            if upstream:
                on_stack = {id(m) for m in self.module_stack} | {None}
                consequence = any(module in on_stack for _, module in upstream)
            reported = set()
            lead = -1  # how many leading arguments are tensors (`_checks.applies`), once
            if reads is not None:
                reads.__enter__()
            try:
                for rule in rules:
                    try:
                        if rule.operands:
                            if lead < 0:
                                lead = _checks.leading_operands(args)
                            if lead < rule.operands:
                                continue
                        for violation in rule.check(call):
                            yielded = True
                            violation.severity = _checks.severity(rule, violation)
                            if violation.severity == "warning" and consequence:
                                # A tensor of this block already carries a warning: what
                                # follows from it is that bug again, in other words.
                                continue
                            reported.add((violation.kind, here))
                            found = self.report(violation, call)
                            broken = broken or found
                    except Exception as error:
                        # The rule's own failure (its findings, raised, pass: `contained`).
                        if not _internal.contained(
                            self.trace, error, _rule_name(rule), op, call.site
                        ):
                            raise
                        yielded = True  # not a clean verdict: never replayed as one
            finally:
                if reads is not None:
                    reads.__exit__(None, None, None)
            if reported:
                call.flagged = frozenset(reported) | upstream
            call.reported = bool(reported)
        try:
            if step is not None and reads is not None and reads.read:
                # Before the op: an op in place changes what it writes into.
                tensors = call.tensors()
                step.values = tuple(
                    (k, _replay.fingerprint(tensors[k])) for k in sorted(reads.read)
                )
        except Exception as error:
            if not _internal.contained(self.trace, error, "recording", op, call.site):
                raise
            step = None
            self._abandon_replay()
        try:
            out = func(*args, **kwargs)
        except ShapeError:
            raise
        except RuntimeError as error:
            if type(error) is not RuntimeError:
                # torch's own kind of failure (NotImplementedError: DTensor has no sharding
                # strategy for an op; OutOfMemoryError; a collective's DistError), which
                # `except` clauses in the user's code look for: kept as it is.
                raise
            # torch fails where a rule said it would: shapeguard's own account of it.
            explained = broken or self._explain(error, call)
            broken = found = None  # no frame -> error cycle (`_reporting.deliver`)
            if explained is None:
                raise  # shapeguard could not describe it: torch's own error
            try:
                raise explained from error
            finally:
                explained = None
        try:
            if not tensors and _symbolic(out):
                # A factory of symbolic sizes (make_fx making a fake input): not recorded.
                self._append(None, _replay.Why.SYMBOLIC)
            elif step is None or yielded or upstream:
                self._record(call, out)
                if self.recorder is not None or self._expected is not None:
                    self._append(
                        None,
                        _replay.Why.FINDING
                        if yielded
                        else _replay.Why.FLAGGED
                        if upstream
                        else _replay.Why.UNKEYABLE,
                    )
            else:
                self._record_step(step, call, out, reads)
        except Exception as error:
            if not _internal.contained(self.trace, error, "recording", op, call.site):
                raise
            self._abandon_replay()
        self.step += 1
        return out

    def _explain(self, error: RuntimeError, call: OpCall) -> ShapeError | None:
        """`_torch_error`, or None when describing the failure failed (contained: torch's
        own error is raised then)."""
        try:
            return self._torch_error(error, call)
        except Exception as failure:
            if not _internal.contained(
                self.trace, failure, "describing torch's error", call.op, call.site
            ):
                raise
            return None

    def _abandon_replay(self) -> None:
        """After a failure of shapeguard's own code: neither replay nor record from here in
        this session (a recording cut at a failure is no recording to follow). What a
        replay owes is made when read, as after a divergence."""
        if self.replay is not None:
            self.trace.replay_stops[_replay.Why.OWN_FAILURE] += 1
        self.replay = None
        self._choices = []
        self.recorder = None  # dropped, not remembered

    def _begin_step(self, call: OpCall, rules):
        """The step a recorded op will be, as far as it is known before its rules run."""
        step = _replay.Step(_replay.OP)
        step.func = call.func
        step.site = call.site
        stack = self.module_stack
        step.module = _weak(stack[-1]) if stack else None
        self._describe_inputs(step, call.tensors())
        loose = _replay.loose_numbers(call.spec, rules, call.args)
        try:
            step.args = _replay.args_check(call.args, call.kwargs, loose)
        except _replay.Unkeyable:
            return None
        call.extras = []
        return step

    def _record_step(self, step, call: OpCall, out, reads) -> None:
        """Record the op (as `_record` does) and what it did, as a step to replay."""
        tensors = call.tensors()
        capture = _replay.Capture([call.meta_of(t) for t in tensors])
        reads.__enter__()
        try:
            made = self._record(call, out)
        except BaseException:
            capture.abandon()
            raise
        finally:
            reads.__exit__(None, None, None)
        outputs = _tensors_of(out)
        try:
            if len(outputs) >= _replay.MAX_OUTPUTS or len(reads.read) > len(step.values):
                capture.abandon()
                raise _replay.Outside  # (or an axis rule read values: none does)
            step.effects = capture.end(made)
            step.extras = self._extras(call, outputs)
        except _replay.Outside:
            self._append(None, _replay.Why.OUTSIDE)
            return
        step.outputs = tuple(o.shape for o in outputs)
        if outputs:
            path, cls, _ = self.module_description()
            step.event = (
                call.op,
                path,
                cls,
                call.site,
                _shared(tuple([_static(t) for t in tensors])),
                _shared(tuple([_static(t) for t in outputs])),
            )
        self._append(step)

    def _extras(self, call: OpCall, outputs: list) -> tuple:
        """Where the rules' reads of tensors that are not arguments came from: names in the
        user's frame, which a replay looks up again (raises Outside when not found)."""
        if not call.extras:
            return ()
        frame = _source.user_frame()
        local = frame.f_locals if frame is not None else {}
        found = []
        for tensor, known in call.extras:
            if any(t is tensor for t in outputs):
                continue
            if not known:
                raise _replay.Outside  # a tensor first seen by a rule: not worth replaying
            name = next((n for n, v in local.items() if v is tensor), None)
            if name is None:
                raise _replay.Outside
            found.append((name, self.metas.get(tensor).slot))
        return tuple(found)

    def _context(self, call: OpCall) -> Context:
        _, _, module = self.module_description()
        site = call.site
        return Context(
            module=module,
            location=site.location if site else "",
            source=site.source if site else "",
        )

    def report(self, violation: Violation, call: OpCall) -> ShapeError | None:
        """Raise or warn for one violation, and record it as a finding. In warn mode an
        error is returned too: if torch then fails on the op, that is the error to raise."""
        __tracebackhide__ = True
        violation.op = violation.op or call.op
        context = self._context(call)
        site = call.site
        return _reporting.deliver(
            # Not kept in a local: a raised error must not be held by a frame it passes
            # through (`deliver`: the cycle it would make).
            ShapeError.from_violation(violation, context),
            violation.severity,
            mode=self.trace.mode,
            strict=self.trace.strict,
            trace=self.trace,
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
            once=self._warned,
        )

    def _flagged(self, call: OpCall) -> frozenset:
        found: frozenset = NO_FLAGS
        for t in call.tensors():
            meta = call.meta(t)
            if meta is not None and meta.flagged:
                found = found | meta.flagged
        return found

    def _torch_error(self, error: RuntimeError, call: OpCall) -> ShapeError:
        operands = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, torch.Tensor):
                operands.append(call.operand(call.label(i, f"arg{i}"), arg))
            elif isinstance(arg, list | tuple):  # torch.cat([a, b]), torch.stack(...)
                base = call.label(i, f"arg{i}")
                items = _source.sequence_items(call.source_text(i) or "") or []
                operands += [
                    call.operand(items[j] if j < len(items) else f"{base}[{j}]", t)
                    for j, t in enumerate(arg)
                    if isinstance(t, torch.Tensor)
                ]
        operands += [
            call.operand(name, value)
            for name, value in call.kwargs.items()
            if isinstance(value, torch.Tensor)
        ]
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        context = self._context(call)
        shape_error = ShapeError(
            f"{call.op} failed in torch: {first_line}",
            kind="torch_error",
            op=call.op,
            module=context.module,
            location=context.location,
            source=context.source,
            operands=operands,
            hint="shapeguard has no rule for this failure yet; the operand shapes above are "
            "what torch was given",
        )
        self.trace.add_finding(shape_error)
        return shape_error

    def _record(self, call: OpCall, out) -> list:
        """Name the op's outputs and record its event; returns the outputs' metas."""
        outputs = _tensors_of(out)
        if not outputs:
            return []
        spec = call.spec
        in_tensors = call.tensors()
        meta_of = call.meta_of
        in_metas = [meta_of(t) for t in in_tensors]
        made = _flow.propagate(call, outputs)
        if self.tp_split:
            _tp_session.carry(self, call, in_tensors, outputs)
        labels = self._output_labels(call, len(outputs))
        first_label = in_metas[0].label if in_metas else None
        if spec.keeps_value and len(in_tensors) == 1:
            buffer, sliced = buffer_origin(
                True, spec.slices, in_tensors, in_metas, self.module_stack
            )
        else:  # what buffer_origin answers for these, without the call
            buffer, sliced = "", False
        out_metas = []
        slot = self.step * _replay.MAX_OUTPUTS
        flagged = call.flagged
        op = call.op
        table = self.metas
        for k, (tensor, m) in enumerate(zip(outputs, made, strict=True)):
            label = labels[k] if k < len(labels) else None
            if label is None and k == 0 and first_label:
                label = self._kept_label(call, spec, in_metas, first_label)
            meta = TensorMeta.made(
                m.dims,
                Facts(
                    tags=m.tags,
                    label=label,
                    role=role_for(label, m.role),
                    op=op,
                    buffer=buffer,
                    sliced=sliced,
                    rotary=m.rotary,
                    param=m.param,
                    flagged=flagged,
                    laid_out=m.laid_out,
                ),
                slot + k + 1,
            )
            table[tensor] = meta
            out_metas.append(meta)
        trace = self.trace
        if len(trace._events) + len(trace._pending) >= trace.max_events:
            trace.dropped_events += 1
            return out_metas
        stack = self.module_stack
        if stack:  # module_description's path and class, without its "path (Class)"
            module = self.described_module()
            path, cls = self.module_path(module), type(module).__name__
        else:
            path = cls = ""
        trace.record(
            op,
            path,
            cls,
            call.site,
            _shared(tuple([_static(t, m) for t, m in zip(in_tensors, in_metas, strict=True)])),
            _shared(tuple([_static(t, m) for t, m in zip(outputs, out_metas, strict=True)])),
            (*in_metas, *out_metas),
        )
        return out_metas

    def _kept_label(self, call: OpCall, spec, in_metas: list, first_label: str) -> str | None:
        """The label an output keeps from its input when the source line gives none."""
        if spec.family == _ops.LAYOUT and call.args and hasattr(call.args[0], "dim"):
            ndim = call.args[0].dim()
            order = _flow.layout_order(call, ndim)
            moved = [i for i, j in enumerate(order or ()) if i != j]
            if len(moved) == 2 and moved == [ndim - 2, ndim - 1]:
                return first_label + "^T"  # the last two axes swapped: K^T
        if spec.keeps_label:
            return first_label
        if spec.makes_mask and in_metas[0].role == "mask":
            return first_label  # `mask == 0` is still the mask
        if call.op == "__getitem__":
            # A slice of a tensor is that tensor: `self.bias[:, :, :T, :T]` is `bias`.
            text = call.source_text(0)
            return _source.short_label(text) if text else first_label
        return None

    def _output_labels(self, call: OpCall, count: int) -> tuple[str | None, ...]:
        site = call.site
        if site is None or not site.targets:
            return ()
        if site.in_module:
            # Inside a module called from this line: only a leaf module (Linear,
            # Dropout, LayerNorm) is one op, so only its output takes the target name.
            module = call.module
            if module is None or next(module.children(), None) is not None:
                return ()
        elif not call.site_matches():
            return ()
        if len(site.targets) == count:
            return site.targets
        return (site.targets[0],) if len(site.targets) == 1 else ()


def _lift(previous: "Session | None") -> "Session | None":
    """Take a background session's mode off the stack while a session opened inside it is
    open: it steps aside then (it lets every call through to the inner one, which records
    it), and a mode below the inner one is called again for every op the inner one runs
    and for every tensor attribute the inner one's own code reads (tens of thousands of
    calls in the project's suite). Only when its mode is the top of the stack; returns
    the session lifted, or None."""
    if (
        previous is None
        or not previous.trace.background
        or _composites.top_mode() is not previous._mode
    ):
        return None
    _pop_torch_function_stack()
    return previous


def _class(module) -> str:
    return type(module).__name__


def _rule_name(rule) -> str:
    return f"rule {rule.family}.{getattr(rule.check, '__qualname__', '?')}"


def _weak(module):
    try:
        return weakref.ref(module)
    except TypeError:
        return lambda: module


def _nested_tensors(name: str, value, depth: int = 0) -> list:
    """(label, tensor) for a root input and the tensors nested in it: a dict or dataclass
    batch (`batch.input_ids`), a few levels deep. Tuples are not looked into (a legacy
    cache is a tuple of tuples of past keys and values, not a batch)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if depth >= 3:
        return []
    if isinstance(value, dict):
        items = list(value.items())
    elif hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        items = [(f, getattr(value, f, None)) for f in value.__dataclass_fields__]
    else:
        return []
    found = []
    for key, item in items:
        found += _nested_tensors(f"{name}.{key}", item, depth + 1)
    return found


def _symbolic(out) -> bool:
    """Whether an output has symbolic sizes (a fake tensor: make_fx, export)."""
    return any(t._has_symbolic_sizes_strides for t in _tensors_of(out))


def _tensors_of(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


_param_cache: "weakref.WeakKeyDictionary[type, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def _parameter_names(cls: "type[torch.nn.Module]") -> tuple[str, ...]:
    names = _param_cache.get(cls)
    if names is None:
        try:
            params = list(inspect.signature(cls.forward).parameters)
        except (TypeError, ValueError):
            params = []
        names = tuple(p for p in params if p != "self")
        _param_cache[cls] = names
    return names


def open_session(trace: Trace, root, opener=None) -> Session:
    """Open a session. `opener` (from `_replay.opener`) says who opens it, so a session
    that repeats an earlier one of the same opener replays it (see `_replay`)."""
    session = Session(trace, root, opener)
    session.open()
    return session


def close_session(session: Session) -> None:
    session.close()
