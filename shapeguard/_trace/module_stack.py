"""The module stack of a session: the module hooks, entering and leaving modules (the
root's inputs named on the way in), and module paths and descriptions for messages.
"""

import weakref

from .. import _config
from .._names import axes as _axes
from .._reach import intent as _intent
from . import composites as _composites
from . import construction as _construction
from . import internal as _internal
from . import owed as _owed
from . import replay as _replay
from .current import current_session
from .interceptor import is_compiling, not_running, torch_compiling
from .session_state import SessionState

_ENTER, _EXIT = _replay.ENTER, _replay.EXIT


def _class(module) -> str:
    return type(module).__name__


def weak(module):
    try:
        return weakref.ref(module)
    except TypeError:
        return lambda: module


class ModuleStack(SessionState):
    """The modules a session is in, innermost last (`Session` is one)."""

    @property
    def root(self):
        """The module the trace started from: given, or the first one a block entered (held
        weakly: a model the user drops inside a long block, or a test under the pytest
        plugin, is collected)."""
        ref = self._root
        return ref() if ref is not None else None

    def _on_module_enter(self, module, args) -> None:
        if is_compiling():
            # Dynamo traces these global hooks with a compiled module's forward: nothing
            # of the session enters its graph (and dynamo cannot trace `current_session`).
            return
        if current_session() is not self:
            return  # an inner session, or another context's, is tracking modules now
        stack = self.module_stack
        replay = self.replay
        if stack and replay is not None and not torch_compiling():
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
            self._root = weak(module)
            self._paths = self._state_names = None
        self.enter_module(module, args, {})

    def _on_module_exit(self, module, args, output) -> None:
        if is_compiling():
            return  # (as on entering)
        try:
            _composites.leave(self, module, output)  # whichever session is current
        except Exception as error:
            if not _internal.contained(self.trace, error, "leaving a composite", _class(module)):
                raise
        if current_session() is self:
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
                    if not stack:
                        self.root_inputs = None  # the forward is over: hold none of it
                    return
            self.exit_module(module)

    def enter_module(self, module, args: tuple, kwargs: dict) -> None:
        if is_compiling():
            return
        if not_running():
            return  # a module run under vmap or make_fx: its ops go through (`_dispatch`)
        try:
            first = not self.module_stack
            if first:
                self.enabled = _config.is_enabled()  # once per forward, not per op
                self.trace._forward += 1
                if len(self.ledger.steps) > _owed.MAX_OWED:
                    self.ledger.pay()
                # Each forward's own, replayed or not: what intent is read from at its sites.
                # A global pre-hook gets no keywords: read them from the module's call.
                named = self._input_tensors(module, args, kwargs or _composites.call_kwargs(module))
                self.root_inputs = _intent.RootInputs(named)
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
                step.module = weak(module)
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
            and not_running()
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
                step.module = weak(module)
                self._append(step)
        except Exception as error:
            if not _internal.contained(self.trace, error, "leaving a module", _class(module)):
                raise
            self._abandon_replay()
        self.step += 1
        if stack and stack[-1] is module:
            del stack[-1]  # the innermost module: the usual case
        else:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is module:
                    del stack[i:]
                    break
        if not stack:
            # The forward is over: hold none of its inputs, and let go of the metas of the
            # tensors it freed now, not at the table's next doubling (a count of them that
            # depended on id reuse: tests/test_gc_pressure.py).
            self.root_inputs = None
            self.metas.sweep()

    def declared_sizes(self, module) -> dict[str, tuple[str, int]]:
        """`_axes.declared_sizes`, read once per module per session."""
        key = id(module)
        found = self._declared.get(key)
        if found is None:
            found = _axes.declared_sizes(module)
            if found:
                found = self.tp.local_sizes(module, found)  # a TP shard's local head counts
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
