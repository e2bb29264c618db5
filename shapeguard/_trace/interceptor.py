"""The interceptor: the TorchFunctionMode that hands every torch function, Tensor method
and operator call to the session open in the calling context. The replay layer is
consulted first (`Session._replay_op`: the op as the recording's next step, or MISSED),
then the reference path (`Session._dispatch`: check, run, name, record).

One interceptor per thread, on torch's (per-thread) mode stack while any session of the
thread is open (`acquire_interceptor` and `release_interceptor` count them): sessions belong to contexts (`current`),
several of which (asyncio tasks) share a thread and its mode stack. The last session to
close takes it off wherever it sits, so blocks closed in any order leave no mode behind.
"""

import threading

import torch
from torch._C import (
    _get_function_stack_at,
    _len_torch_function_stack,
    _pop_torch_function_stack,
    _push_on_torch_function_stack,
)
from torch.overrides import TorchFunctionMode

from .. import _config, _ops
from .._memo import Memo
from .current import open_sessions, thread_state

_QUERY = _ops.QUERY
torch_compiling = torch.compiler.is_compiling
_transforms_active = torch._C._are_functorch_transforms_active
_dispatch_mode = torch._C._get_dispatch_mode
_PROXY, _FAKE = torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FAKE


def not_running() -> bool:
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


def is_compiling() -> bool:
    """Whether dynamo is tracing (not while shapeguard checks a compiled module eagerly:
    `_compiled.check`)."""
    return torch_compiling() and not getattr(thread_state, "eager", False)


MISSED = object()  # a replayed op that was not the recording's next step

# (spelling, op) by the function torch hands the mode: two lookups made once per function.
_SPECS = Memo("op specs", 4096)  # bounded: the same few hundred functions make every op
_known_spec = _SPECS.get  # the interceptor's lookup, one global call on every op


def spec_of(func) -> tuple:
    """(op, spec) of `func`, from `_SPECS` when known (the interceptor inlines that lookup
    and calls this on a miss only)."""
    try:
        known = _SPECS.get(func)
    except TypeError:  # an unhashable callable: looked up each time
        return _lookup(func)
    if known is None:
        known = _lookup(func)
        if torch_compiling():  # dynamo, tracing this mode, cannot enter the memo's lock
            return known
        known = _SPECS.put(func, known)
    return known


def _lookup(func) -> tuple:
    op = _ops.name_of(func)
    return (op, _ops.lookup(op))


_innermost = open_sessions.get


class Interceptor(TorchFunctionMode):
    shapeguard_interceptor = True  # how code that lists the mode stack tells ours apart

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Session.dispatch, inlined: one frame less on every call torch makes.
        __tracebackhide__ = True
        if kwargs is None:
            kwargs = {}
        try:
            found = _known_spec(func)
        except TypeError:  # an unhashable callable
            found = None
        if found is None:
            found = spec_of(func)
        op, spec = found
        # Before the context is read: dynamo, tracing this mode, cannot read a ContextVar.
        if spec.family == _QUERY or (
            torch_compiling() and not getattr(thread_state, "eager", False)
        ):
            return func(*args, **kwargs)
        sessions = _innermost()
        if not sessions:
            return func(*args, **kwargs)  # another task of this thread has a trace open
        # A closed one (a task outliving its creator's block) lets every call through:
        # `close` turns `enabled` off and empties `observers`.
        session = sessions[-1]
        if session.observers:  # the one test an unobserved session pays (`Session.observe`)
            return session._observed(func, op, spec, args, kwargs)
        if session._dispatching or not session.enabled or _config.disabled_by_api:
            return func(*args, **kwargs)
        session._dispatching = True
        try:
            if session.replay is not None:
                out = session._replay_op(func, op, spec, args, kwargs)
                if out is not MISSED:
                    return out
            return session._dispatch(func, op, spec, args, kwargs)
        finally:
            session._dispatching = False


class _Holder:
    """A thread's interceptor and how many of the thread's sessions use it."""

    __slots__ = ("mode", "users")

    def __init__(self) -> None:
        self.mode = Interceptor()
        self.users = 0


_threads = threading.local()


def _holder() -> _Holder:
    holder = getattr(_threads, "holder", None)
    if holder is None:
        holder = _threads.holder = _Holder()
    return holder


def acquire_interceptor() -> Interceptor:
    """The calling thread's interceptor, pushed on torch's mode stack by its first user."""
    holder = _holder()
    if not holder.users:
        _push_on_torch_function_stack(holder.mode)
    holder.users += 1
    return holder.mode


def release_interceptor(mode: Interceptor, *, suspended: bool) -> None:
    """One user of `mode` less: the last takes it off the stack wherever it sits (a mode
    pushed above it by the user stays). While others remain it is put back if something
    took it off (dynamo's trace, unwinding an error, can), unless a composite holds it off
    the stack (`suspended`: `_composites` pushes it back when the composite returns)."""
    holder = getattr(_threads, "holder", None)
    if holder is None or holder.mode is not mode:
        return  # opened in another thread: that thread's stack is not this one's to change
    holder.users = max(holder.users - 1, 0)
    if not holder.users:
        remove(mode)
    elif not suspended and not on_stack(mode):
        _push_on_torch_function_stack(mode)


def on_stack(mode) -> bool:
    return any(_get_function_stack_at(i) is mode for i in range(_len_torch_function_stack()))


def remove(mode) -> int:
    """Take `mode` off torch's function-mode stack wherever it sits; the modes above it
    stay, in their order. Returns how many modes were below it (-1: it was not there)."""
    n = _len_torch_function_stack()
    for i in range(n - 1, -1, -1):
        if _get_function_stack_at(i) is mode:
            above = [_pop_torch_function_stack() for _ in range(n - 1 - i)]
            _pop_torch_function_stack()
            for other in reversed(above):
                _push_on_torch_function_stack(other)
            return i
    return -1


def insert(mode, depth: int) -> None:
    """Put `mode` back on torch's function-mode stack with `depth` modes below it (as
    `remove` found it; at the top where the stack has shrunk since)."""
    n = _len_torch_function_stack()
    above = [_pop_torch_function_stack() for _ in range(max(n - max(depth, 0), 0))]
    _push_on_torch_function_stack(mode)
    for other in reversed(above):
        _push_on_torch_function_stack(other)


def off_stack(func, args: tuple, kwargs: dict):
    """`func(*args, **kwargs)` with the thread's interceptor off torch's mode stack (modes
    above it stay, in their order), put back where it was after, also on an exception.

    For calls that run code compiled by torch.compile: dynamo guards each compiled frame on
    the types of the modes on the stack, so under the interceptor the frame is compiled
    once more, and once dynamo's recompile limit is spent it runs eagerly, whose output can
    differ in the last bits from the compiled one's. Off the stack, the call runs the code
    an untraced call runs."""
    holder = getattr(_threads, "holder", None)
    if holder is None or not holder.users or not on_stack(holder.mode):
        return func(*args, **kwargs)
    depth = remove(holder.mode)
    try:
        return func(*args, **kwargs)
    finally:
        # Unless the call closed the last session, or a nested one put the mode back.
        if holder.users and not on_stack(holder.mode):
            insert(holder.mode, depth)
