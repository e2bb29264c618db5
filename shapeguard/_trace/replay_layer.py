"""The replay layer of a session: what the interceptor consults before the reference path.

Each op, and each module entered or left, is compared with the recording's next step
(`_trace/replay.py` says what a step is); the same step is replayed: its effects made
(or owed: `_trace/owed.py`) and its event recorded, without running the rules. A step
that differs ends the replay with a stated reason, counted on the trace
(`replay_stops`, the keys of `_replay.Why`), and the reference path runs from there.
`SHAPEGUARD_REPLAY=check` runs each matched step on the reference path instead and
raises `_replay.ReplayMismatch` where its step is not the recorded one. The recording
side (steps begun and captured on the reference path) is here too.

Long because `_replay_op`, the replay's hot path, is one flat function of some
230 lines (each call it would make instead is paid on every replayed op), and the
recording side belongs with the comparison it records for.
"""

import typing
import weakref
from sys import _getframe

import torch

from .. import _source
from .. import checks as _checks
from .._errors import ShapeError
from . import internal as _internal
from . import owed as _owed
from . import replay as _replay
from . import replay_effects as _replay_effects
from . import replay_match as _replay_match
from .call import OpCall
from .interceptor import MISSED, not_running
from .meta import TensorMeta, buffer_name
from .module_stack import weak
from .recording import shared, static, tensors_of
from .session_state import SessionState

_site_epoch = _source.site_epoch
_Tensor = torch.Tensor
_SEQUENCES = (tuple, list)
_UNSET = object()  # the innermost module, not looked up yet
_GENERIC = _replay_match.GENERIC
_OWED = object()  # a replayed step's objects: not resolved, its effects owed (`_owed`)
_CHECK = object()  # a replayed step run on the reference path instead (`_check_op`)


class ReplayLayer(SessionState):
    """A session's replay and recording of steps (`Session` is one)."""

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
            _replay.verify(expected, step, why, step.event[0] if step and step.event else "")
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

    def _abandon_replay(self) -> None:
        """After a failure of shapeguard's own code: neither replay nor record from here in
        this session (a recording cut at a failure is no recording to follow). What a
        replay owes is made when read, as after a divergence."""
        if self.replay is not None:
            self.trace.replay_stops[_replay.Why.OWN_FAILURE] += 1
        self.replay = None
        self._choices = []
        self.recorder = None  # dropped, not remembered

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
                if self._verifying:
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
                    _replay_effects.apply(step.effects, objs, metas, ())
                else:
                    self._owe_firsts(step, tensors, metas)
                    ledger.steps.append(step)
                    ledger.metas.append(tuple(metas))
            self.step += 1
            self.replayed += 1
            return True
        self._diverge(_replay.Why.OTHER_START if i == 0 else _replay.Why.OTHER_ENTER)
        return False

    def _replay_op(self, func, op: str, spec, args: tuple, kwargs: dict):
        """Run the op as the recording's next step says, or return MISSED (nothing done)
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
        verifying = self._verifying
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
                    match = step.match = _replay_match.matcher(step)
                if match:
                    # The arguments and inputs compared in straight code (`_replay_match.matcher`).
                    found = match(args, kwargs, get)
                    if found is not None and found is not _GENERIC:
                        if step.firsts:
                            metas, tensors = found
                        else:
                            metas = found
                        if not ledger.paid:
                            objs = _OWED  # made when read (`_owed`)
                            break
                        if verifying:
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
                if not _replay_match.same_args(step.args, args, kwargs):
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
                        not_running()
                        or (
                            not all(
                                _replay_match.same_values(tensors[k], v) for k, v in step.values
                            )
                            and not self._values_pass(step, func, op, spec, args, kwargs, site)
                        )
                    ):
                        continue
                    if step.extras and not self._match_extras(step.extras):
                        why = _replay.Why.OTHER_FRAME
                        continue
                    if not ledger.paid:  # (`_values_pass` may have paid it)
                        objs = _OWED
                        break
                    if verifying:
                        objs = _CHECK
                        break
                    objs = self._resolve(step, tensors, metas)
                    if objs is None:
                        why = _replay.Why.OTHER_AXES
                        continue
                    break
            else:
                if not_running():
                    plain = True  # never recorded (`_dispatch`): the replay goes on after it
                    return func(*args, **kwargs)
                whose = _source.op_site()
                if whose is _source.OPTIMIZER:
                    plain = True  # torch.optim's own: never recorded either
                    return func(*args, **kwargs)
                self._diverge(_replay.Why.DISTRIBUTED if whose is _source.PLUMBING else why)
                return MISSED
        except Exception as error:
            if plain or not _internal.contained(self.trace, error, "replaying", op):
                raise
            self._abandon_replay()
            return MISSED  # run as usual (`_dispatch`)
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
                outputs = tensors_of(out)
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
                _replay_effects.apply(step.effects, typing.cast("list | None", objs), metas, made)
            reach = step.reach
            passed = self._reach_passed
            if passed is not None:
                self._reach_passed = None
                if passed[0] is step:
                    reach = passed[1]  # read again from other values (`_values_pass`)
            if reach:
                self.keep_reach(reach)
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
        step must be `step`, the one the replay matched (`_replay.verify` raises otherwise).
        Outputs of other shapes make the replay step aside, as they would replaying."""
        __tracebackhide__ = True
        passed, self._reach_passed = self._reach_passed, None
        if passed is not None and passed[0] is step:
            step = _replay.with_reach(step, passed[1])  # the reach read from these values
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

    def _values_pass(self, step, func, op: str, spec, args: tuple, kwargs: dict, site) -> bool:
        """A step whose rules read tensor values that differ from the recorded ones (a
        mask of other paddings): run its rules again, on the state the replay made, which
        is the state they saw when recorded. Clean: replay the step (its axes do not depend
        on values), with the reach read from these values; a finding: run it as usual."""
        call = OpCall(self, func, op, args, kwargs, site, spec)
        call.flagged = self._flagged(call)
        call.extras = []  # as when recorded: a rule that reads a tensor first seen
        for rule in _checks.rules_for(op, _checks.distributed_now()):
            if rule.operands and not _checks.applies(rule, args):
                continue
            for _ in rule.check(call):
                return False
        if not all(known for _, known in call.extras):
            return False  # ... makes it not worth replaying
        # The reach read from these values, for `_replay_op` to keep in the step's place.
        self._reach_passed = (step, call.reach)
        return True

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
            return _replay_effects.resolve(paths, metas) if paths else []
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

    def _begin_step(self, call: OpCall, rules):
        """The step a recorded op will be, as far as it is known before its rules run."""
        step = _replay.Step(_replay.OP)
        step.func = call.func
        step.site = call.site
        stack = self.module_stack
        step.module = weak(stack[-1]) if stack else None
        self._describe_inputs(step, call.tensors())
        loose = _replay_match.loose_numbers(call.spec, rules, call.args)
        try:
            step.args = _replay_match.args_check(call.args, call.kwargs, loose)
        except _replay_match.Unkeyable:
            return None
        call.extras = []
        return step

    def _record_step(self, step, call: OpCall, out, reads) -> None:
        """Record the op (as `_record` does) and what it did, as a step to replay."""
        tensors = call.tensors()
        capture = _replay_effects.Capture([call.meta_of(t) for t in tensors])
        reads.__enter__()
        try:
            made = self._record(call, out)
        except BaseException:
            capture.abandon()
            raise
        finally:
            reads.__exit__(None, None, None)
        outputs = tensors_of(out)
        try:
            if len(outputs) >= _replay.MAX_OUTPUTS or len(reads.read) > len(step.values):
                capture.abandon()
                raise _replay_effects.Outside  # (or an axis rule read values: none does)
            step.effects = capture.end(made)
            step.extras = self._extras(call, outputs)
        except _replay_effects.Outside:
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
                shared(tuple([static(t) for t in tensors])),
                shared(tuple([static(t) for t in outputs])),
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
                raise _replay_effects.Outside  # a tensor first seen by a rule: not worth replaying
            name = next((n for n, v in local.items() if v is tensor), None)
            if name is None:
                raise _replay_effects.Outside
            found.append((name, self.metas.get(tensor).slot))
        return tuple(found)
