"""A session: one trace's interception of the ops of one context, by concern.

A session is opened by `trace()` or by the first guarded module to run, and is closed,
whatever happens, by the same party. While it is the innermost one open in its context
(`_trace/current.py`: an asyncio task, or a thread) every torch function, Tensor method
and operator call there goes through the thread's interceptor (`_trace/interceptor.py`),
which consults the replay layer first (`_trace/replay_layer.py`) and then the reference
path (`Session._dispatch` here: the op's checker runs first, so shape bugs are reported
before torch raises, then the op, then its output is named and recorded). The other
concerns are parts of `Session`: the module stack (`_trace/module_stack.py`), naming the
tensors first seen (`_trace/naming.py`), recording (`_trace/recording.py`) and reporting
(`_trace/findings.py`).
"""

import contextvars
import dataclasses

import torch

from .. import _config, _ops, _source
from .. import checks as _checks
from .._errors import ShapeError
from .._reach import intent as _intent
from . import composites as _composites
from . import flash as _flash
from . import internal as _internal
from . import nodes as _nodes
from . import owed as _owed
from . import replay as _replay
from . import replay_match as _replay_match
from . import torch_entries as _torch_entries
from . import tp_session as _tp_session
from .call import OpCall
from .current import closed, current_session, opened
from .findings import Findings
from .interceptor import (
    MISSED,
    Interceptor,
    acquire_interceptor,
    is_compiling,
    not_running,
    release_interceptor,
    spec_of,
)
from .meta import NO_FLAGS, TensorTable
from .module_stack import ModuleStack, weak
from .naming import InputNaming
from .observe import Observation, Observer
from .record import TraceData
from .recording import Recording, symbolic
from .replay_layer import ReplayLayer

_QUERY = _ops.QUERY

# Kinds whose tensor holds data a view moved across axes: its axes no longer hold what their
# names say, so a warning the enclosing block reads off them is that bug again.
_SCRAMBLED = frozenset({"view_mixes_axes", "batch_mixing"})


class Session(ModuleStack, InputNaming, Recording, Findings, ReplayLayer):
    """The live side of a TraceData: mode, hooks, module stack and tensor names."""

    def __init__(self, trace: TraceData, root, opener=None) -> None:
        self.trace = trace
        self._root = weak(root) if root is not None else None
        self.owner = None  # the guarded module that opened this session, if any
        self.background = trace.background
        self.owner_depth = 0
        self.metas = TensorTable()
        self._state_names: dict[int, str] | None = None
        self.module_stack: list = []
        self._paths: dict[int, str] | None = None
        self._seen_modules: set[int] = set()
        self._declared: dict[int, dict[str, tuple[str, int]]] = {}
        # The root's inputs of the forward running, held weakly (`_reach.intent`).
        self.root_inputs: _intent.RootInputs | None = None
        self._warned: set[tuple[str, str]] = set()
        self._mode: Interceptor | None = None  # the thread's, while this session is open
        self._handles: list = []
        self._dispatching = False
        self._previous: Session | None = None
        # Of the context's open sessions, set by `open` (reset by `current.closed`).
        self._token: contextvars.Token | None = None
        self.live = False  # open: what `current_session` asks of the innermost session
        self._flash_held = False  # this session holds a wrap of flash-attn's entry points
        self._torch_held = False  # and of torch's (`torch_entries`)
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
        self.replayed = 0  # steps replayed (the trace sums them: `TraceData._replayed`)
        # `SHAPEGUARD_REPLAY=check`: each step a replay matches runs the reference path,
        # whose step (`_append`) must be `_expected`, the one the replay matched.
        self._verifying = False
        self._expected = None
        self._fresh = 0  # tensors made outside the trace, numbered as first seen (negative)
        self._reach_passed: tuple | None = None  # see `ReplayLayer._values_pass`
        # The replayed steps whose effects are made when first read (`_owed`).
        self.ledger = _owed.Ledger()
        # What `observe` registered: told of every op the mode is handed (empty: none).
        self.observers: tuple = ()
        # Tensor parallelism's state, all of it: the one member the session asks about it.
        self.tp = _tp_session.SessionTP(self)

    def open(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._on_module_enter),
            hooks.register_module_forward_hook(self._on_module_exit, always_call=True),
        ]
        previous = current_session()
        try:
            self._mode = acquire_interceptor()
        except BaseException:
            self._remove_hooks()
            raise
        self._previous = previous
        self._token = opened(self)
        self.live = True
        self.trace._live += 1
        self._flash_held = _flash.patch()
        self._torch_held = _torch_entries.patch()
        self.enabled = _config.is_enabled()
        opener = self._opener
        if opener is not None:
            self._verifying = _replay.verifying()
            if self._verifying:
                self.ledger.pay()  # (nothing owed: the reference path makes every step)
            if opener.recordings:
                self._choices = [r.steps for r in opener.recordings]
                self.replay = self._choices[0]
            elif opener.sessions:
                self.recorder = []  # the second session of an opener: the first recorded
            opener.sessions += 1

    def close(self) -> None:
        # First, so the wrapped functions are restored whatever fails below (never raises).
        held, self._flash_held = self._flash_held, False
        _flash.restore(held)
        held, self._torch_held = self._torch_held, False
        _torch_entries.restore(held)
        self._stop_recording()
        self.replay = None
        self.trace._replayed += self.replayed
        self.trace._steps += self.step
        if not self.ledger.paid and self.ledger.steps:
            self.trace._ledgers.append(self.ledger)  # its events' metas: paid when read
        try:
            _composites.release(self)  # a composite's suspended mode, before ours is released
        finally:
            self._remove_hooks()
            mode, self._mode = self._mode, None
            if mode is not None:
                release_interceptor(mode, suspended=_composites.suspending())
            # Out of the context's open sessions wherever it sits (blocks closed in any
            # order); a copy of the context (a task it made) sees it closed.
            self.live = False
            self.enabled = False
            self.observers = ()
            token, self._token = self._token, None  # the token holds the context: no cycle
            closed(self, token)
            previous, self._previous = self._previous, None
            if previous is not None and previous.background:
                previous.trace.findings.extend(self.trace.findings)
                for reach in self.trace.reach:
                    previous.trace.add_reach(reach)
                for failure in self.trace.internal_errors:
                    previous.trace.add_internal(dataclasses.replace(failure))
            self.trace._live -= 1
            if not self.trace._live:
                self.trace.settle()
            self.metas = TensorTable()
            self.module_stack.clear()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

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
        if spec.family == _QUERY or not_running():
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

    def dispatch(self, func, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        op, spec = spec_of(func)
        return self._dispatch_op(func, op, spec, args, kwargs)

    def _dispatch_op(self, func, op: str, spec, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        if (
            spec.family == _QUERY
            or self._dispatching
            or is_compiling()
            # Only the innermost session of the context checks an op.
            or current_session() is not self
            or not self.enabled
            or _config.disabled_by_api
        ):
            return func(*args, **kwargs)
        self._dispatching = True
        try:
            if self.replay is not None:
                out = self._replay_op(func, op, spec, args, kwargs)
                if out is not MISSED:
                    return out
            return self._dispatch(func, op, spec, args, kwargs)
        finally:
            self._dispatching = False

    def _dispatch(self, func, op: str, spec, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        if not_running():
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
                    reads = _replay_match.ValueReads(tensors) if step is not None else None
                    _nodes.note(call)  # before the rules: their messages show the nodes
        except Exception as error:
            if not _internal.contained(self.trace, error, "preparing the checks", op):
                raise
            self._abandon_replay()
            return func(*args, **kwargs)
        if call is None:
            if site is _source.PLUMBING:
                return self.tp.plumbing(func, spec, args, kwargs)
            return func(*args, **kwargs)  # torch.optim's own, symbolic sizes
        broken = None  # the first error warn mode let through
        yielded = False
        if rules:
            here = id(self.module_stack[-1]) if self.module_stack else None
            consequence = False
            if upstream:
                on_stack = {id(m) for m in self.module_stack} | {None}
                consequence = any(module in on_stack for _, module in upstream)
                scrambled = {module for kind, module in upstream if kind in _SCRAMBLED}
                if scrambled and not consequence and self.module_stack:
                    # A child's scrambled output handled by its parent (a Swin block's window
                    # reverse after its attention merged heads into tokens); a later sibling,
                    # or the next layer with the same bug, still speaks for itself.
                    inside = {id(m) for m in self.module_stack[-1].modules()}
                    consequence = not scrambled.isdisjoint(inside)
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
            if call.reach:
                self.keep_reach(call.reach, step)
        try:
            if step is not None and reads is not None and reads.read:
                # Before the op: an op in place changes what it writes into.
                tensors = call.tensors()
                step.values = tuple(
                    (k, _replay_match.fingerprint(tensors[k])) for k in sorted(reads.read)
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
            if not tensors and symbolic(out):
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


def _rule_name(rule) -> str:
    return f"rule {rule.family}.{getattr(rule.check, '__qualname__', '?')}"


def open_session(trace: TraceData, root, opener=None) -> Session:
    """Open a session. `opener` (from `_replay.opener`) says who opens it, so a session
    that repeats an earlier one of the same opener replays it (see `_replay`)."""
    session = Session(trace, root, opener)
    session.open()
    return session


def close_session(session: Session) -> None:
    session.close()
