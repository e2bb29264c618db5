"""The interceptor: the TorchFunctionMode a session pushes, which hands every torch
function, Tensor method and operator call of its thread to the session. The replay layer
is consulted first (`Session._replay_op`: the op as the recording's next step, or MISSED),
then the reference path (`Session._dispatch`: check, run, name, record).
"""

import torch
from torch.overrides import TorchFunctionMode

from .. import _config, _ops
from .._memo import Memo
from .current import thread_state
from .session_state import SessionState

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
        known = _SPECS.put(func, _lookup(func))
    return known


def _lookup(func) -> tuple:
    op = _ops.name_of(func)
    return (op, _ops.lookup(op))


class _Closed:
    """What a closed session's mode holds instead of it: every call goes through."""

    observers = ()
    _dispatching = True


CLOSED = _Closed()


class Interceptor(TorchFunctionMode):
    shapeguard_interceptor = True  # how `_composites` tells ours from other modes

    def __init__(self, session: SessionState) -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Session.dispatch, inlined: one frame less on every call torch makes.
        __tracebackhide__ = True
        session = self.session
        if kwargs is None:
            kwargs = {}
        try:
            found = _known_spec(func)
        except TypeError:  # an unhashable callable
            found = None
        if found is None:
            found = spec_of(func)
        op, spec = found
        if session.observers:  # the one test an unobserved session pays (`Session.observe`)
            return session._observed(func, op, spec, args, kwargs)
        if (
            spec.family == _QUERY
            or session._dispatching
            or (torch_compiling() and not getattr(thread_state, "eager", False))
            or getattr(thread_state, "session", None) is not session
            or not session.enabled
            or _config.disabled_by_api
        ):
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
