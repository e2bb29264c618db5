"""Which forwards of a running program `shapeguard run` traces, and how it counts its steps.

Two global module hooks (a forward pre-hook and an `always_call` forward hook) see every
`nn.Module` call the program makes. A watched call opens a session on the module with the
inputs the program really passes, and the hook after its forward closes it (also when
forward raises). Every other call costs the two hooks and no session: the disabled cost.

- **Which modules.** With `--module NAME`, the modules whose class is NAME (its name or
  `module.QualName`), the outermost one where they nest. Without it, each *root-most* module
  (one called while no module's forward runs) is traced on its first call, and kept only if
  that forward reached attention (scaled_dot_product_attention, `nn.MultiheadAttention`,
  flash-attn, FlexAttention, or a softmax over a query-key product) or made a finding (a
  guarded module's own, too); any other module is left alone from then on.
- **Which calls.** Per module, the first `calls` calls of each input signature (the tensor
  arguments' shapes and dtypes, the other arguments' types).
- **Compiled code** is not traced (a compiled forward runs no Python a session could see):
  the hooks do nothing while dynamo traces them, and a `torch.compile` wrapper met where a
  module would be traced is left alone and named in the report.
- **Steps.** A training step is counted at the first backward through a watched forward's
  output, or the first `optimizer.step()`, after a watched forward. Once `steps` are counted
  the program is stopped (`Stopped`) at its next `optimizer.step()` end or module call.
"""

import contextlib
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from .._config import is_enabled
from .._contract.call import signature_key
from .._errors import ShapeWarning
from .._ops import lookup
from .._public_trace import Trace
from .._trace.composites import call_kwargs
from .._trace.current import current_session
from .._trace.interceptor import torch_compiling
from .._trace.opening import begin
from .._trace.session import close_session
from .run_program import Stopped

if TYPE_CHECKING:
    from .check_summary import Summary

# Steps of attention (`_ops.STEPS`) that are attention by themselves, and the roles a
# hand-written attention gives its tensors (`_names/roles`).
_FUSED_STEPS = ("fused", "module")
_ATTENTION_ROLES = ("scores", "attn")
_COMPILE_NOTICE = r"Using `torch.compile\(module\)` when there are global hooks on modules"


@dataclass(slots=True, eq=False)
class Watched:
    """One watched module: its trace (every traced call's sessions record into it)."""

    name: str  # the class name
    trace: Trace
    signatures: dict = field(default_factory=dict)  # input signature -> calls traced
    calls: int = 0  # calls seen, traced or not
    # With --check: the module and its first traced call's inputs, copied
    # (`run_check.Sample`, None past its bound), held until the probes ran; their verdict.
    module: object = None
    sample: object = None
    check: "Summary | None" = None

    @property
    def traced(self) -> int:
        return sum(self.signatures.values())


@dataclass(slots=True)
class _Open:
    """The session a watched call opened on this thread, closed when its forward ends."""

    session: object
    module: object
    watched: Watched
    depth: int
    first: bool
    handle: object  # the module's own always_call hook that closes it


class Watcher:
    """The hooks' state; `install()` puts the hooks on, `remove()` takes them off."""

    def __init__(
        self,
        *,
        names: tuple[str, ...] = (),
        calls: int = 1,
        steps: int | None = None,
        keep_inputs: bool = False,
    ):
        self.names = names
        self.keep_inputs = keep_inputs
        self.calls = calls
        self.steps = steps
        self.watched: list[Watched] = []  # kept, in the order first called
        self.compiled: list[str] = []  # compiled modules met where one would be traced
        self.steps_done = 0
        self._state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._matches: dict[type, bool] = {}
        self._local = threading.local()
        self._pending_step = False
        self._stop = False
        self._handles: list = []
        self._stale: list = []  # the closing hooks of closed sessions, to take off
        self._filters: list[tuple] = []

    # -- installing --------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules import module
        from torch.optim.optimizer import register_optimizer_step_post_hook

        # Findings are the report's; warnings would change the program's own stderr. So
        # would torch's notice that global hooks fire twice around torch.compile's wrapper.
        warnings.filterwarnings("ignore", category=ShapeWarning)
        self._filters.append(warnings.filters[0])
        warnings.filterwarnings("ignore", _COMPILE_NOTICE, UserWarning)
        self._filters.append(warnings.filters[0])
        self._handles = [
            module.register_module_forward_pre_hook(self._before),
            module.register_module_forward_hook(self._after, always_call=True),
        ]
        if self.steps is not None:
            self._handles.append(register_optimizer_step_post_hook(self._optimizer_step))

    def remove(self) -> None:
        """Take the hooks off and close a session left open (Ctrl-C between two hooks)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        opened = getattr(self._local, "open", None)
        self._local.open = None
        if opened is not None:
            self._close(opened)
        for handle in self._stale:
            handle.remove()
        self._stale = []
        # Only ours: filters the program added stay. An "ignore" filter registers
        # nothing, so no warning registry needs resetting.
        for entry in self._filters:
            with contextlib.suppress(ValueError):
                cast(list, warnings.filters).remove(entry)
        self._filters = []

    # -- the hooks ---------------------------------------------------------------------------
    def _before(self, module, args) -> None:
        if torch_compiling():
            return  # dynamo tracing the hook: compiled code is not traced (design: compile means off)
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if self._stale:
            for handle in self._stale:
                handle.remove()
            self._stale.clear()
        if self._stop:
            self._stop = False
            raise Stopped()
        if getattr(local, "open", None) is not None:
            return  # inside a traced forward: its session sees this call
        if self.names:
            if not self._named(type(module)):
                return
        elif depth:
            return
        watched = self._state.get(module, False)
        if watched is None:
            return  # no attention on its first call
        if not is_enabled() or current_session() is not None:
            return  # off, or the program traces this forward itself (`shapeguard.trace`, a guard)
        self._open(module, args, watched, depth)

    def _open(self, module, args, watched, depth: int) -> None:
        first = watched is False
        if first and type(module).__module__.startswith("torch._dynamo"):
            # torch.compile's wrapper: its forward runs compiled, which a session cannot see.
            self._state[module] = None
            self.compiled.append(type(module).__name__)
            return
        if first:
            # A background trace, as the pytest plugin's: a guarded module inside keeps its
            # own session, mode and raise (the program runs as without shapeguard run), and
            # its findings come back to this trace when that session closes.
            watched = Watched(type(module).__name__, Trace(mode="warn", background=True))
            self._state[module] = watched
        watched.calls += 1
        kwargs = call_kwargs(module)
        key = signature_key(args, kwargs)
        traced = watched.signatures.get(key, 0)
        if traced >= self.calls:
            return
        if self.keep_inputs and not watched.signatures:
            from .run_check import copy_inputs

            watched.module = module
            watched.sample = copy_inputs(args, kwargs)  # before forward can write to them
        watched.signatures[key] = traced + 1
        session = begin(watched.trace, module, args, kwargs)
        # Closed by a hook of the module's own, not by `_after`: when forward raises, torch
        # runs the global always_call hooks while it iterates their dict, and closing the
        # session takes its own global hooks out of that dict.
        handle = module.register_forward_hook(self._closing, always_call=True)
        self._local.open = _Open(session, module, watched, depth, first, handle)

    def _after(self, module, args, output) -> None:
        if torch_compiling():
            return
        local = self._local
        depth = getattr(local, "depth", 1) - 1
        local.depth = depth
        if self.steps is not None and self._state.get(module):  # a watched module, any depth
            self._watch_backward(output)

    def _closing(self, module, args, output) -> None:
        opened = getattr(self._local, "open", None)
        if opened is None or opened.module is not module:
            return
        self._local.open = None
        self._close(opened)

    def _close(self, opened: _Open) -> None:
        # Taken off at the next module call: while forward's error passes, torch iterates
        # the module's hooks as they are.
        self._stale.append(opened.handle)
        session = opened.session
        stack = session.module_stack  # type: ignore[attr-defined]
        try:
            if stack and stack[-1] is opened.module:  # else the session's own hook left it
                session.exit_module(opened.module)  # type: ignore[attr-defined]
        finally:
            close_session(session)  # type: ignore[arg-type]
        if not opened.first:
            return
        trace = opened.watched.trace
        if self.names or trace.findings or has_attention(trace):
            self.watched.append(opened.watched)
        else:
            self._state[opened.module] = None

    def _named(self, cls: type) -> bool:
        known = self._matches.get(cls)
        if known is None:
            qualified = f"{cls.__module__}.{cls.__qualname__}"
            known = self._matches[cls] = any(
                n in (cls.__name__, cls.__qualname__, qualified) for n in self.names
            )
        return known

    # -- steps -------------------------------------------------------------------------------
    def _watch_backward(self, output) -> None:
        self._pending_step = True
        node = _first_grad_fn(output)
        if node is not None:
            node.register_hook(self._backward)

    def _backward(self, grad_inputs, grad_outputs) -> None:
        self._count_step()

    def _optimizer_step(self, optimizer, args, kwargs) -> None:
        self._count_step()
        if self._stop:
            self._stop = False
            raise Stopped()

    def _count_step(self) -> None:
        if not self._pending_step or not any(w.traced for w in self.watched):
            return
        self._pending_step = False
        self.steps_done += 1
        if self.steps is not None and self.steps_done >= self.steps:
            self._stop = True


def has_attention(trace: Trace) -> bool:
    """Whether the trace's forward reached attention: a fused attention op or module, or a
    tensor the data flow made scores or attention weights."""
    for event in trace.events:
        if lookup(event.op).step in _FUSED_STEPS or event.role in _ATTENTION_ROLES:
            return True
    return False


def _first_grad_fn(output):
    """The autograd node of the first tensor in a forward's output that has one."""
    import torch

    stack = [output]
    while stack:
        value = stack.pop(0)
        if isinstance(value, torch.Tensor):
            if value.grad_fn is not None:
                return value.grad_fn
        elif isinstance(value, tuple | list):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return None
