"""Guarded modules under `torch.compile`: checked once per new input signature, eagerly,
while dynamo traces them; nothing of shapeguard enters the graph.

Dynamo traces the guard's forward wrapper (or, for torch's composites, its hooks) along
with the module's forward, once per graph it compiles (a new input signature, or one the
graph's guards reject: a bad input always is one). Its first call, `_guard._compiling`, is
not traced: marked as having a constant result, it is called at trace time with the real
arguments, calls `check` (through `_guard._compiled_check`), and its result (True: the
guard steps aside) is a constant of the graph. `check` runs the module forward eagerly under shapeguard, as a
guarded call would, with the RNG and the buffers put back afterwards; its findings are
the eager ones (raised, warned, `last_trace`), and a compiled call with a signature
already checked (compiled, or in an eager call) costs nothing.
"""

import contextlib

import torch

from ._contract.call import remember, signature_key
from ._errors import ShapeError
from ._trace import current as _current

# Not a memo: one class per error type, so that `except` sees one; bounded by the ShapeErrors.
_compiled_errors: dict[type, type] = {}


def check(state, module, *args, **kwargs) -> int:
    """Check one call of a guarded module (`state`: its guard's) eagerly, once per input
    signature (called through `_guard._compiling` while dynamo traces the guard's
    forward)."""
    __tracebackhide__ = True
    if state is None:
        return 0
    key = signature_key(args, kwargs)
    if key in state.compiled or key in state.seen:  # checked already, compiled or eager
        return 0
    remember(state.compiled, key)
    local = _current.thread_state
    local.eager = True
    try:
        with torch.no_grad(), _kept(module, args, kwargs):
            module(*args, **kwargs)
    except ShapeError as error:
        raise _through_dynamo(error) from error.__cause__
    finally:
        local.eager = False
    return 0


class _kept:
    """Put back what an extra eager forward changes: the RNG streams (dropout draws
    from them) and the module's buffers (a BatchNorm's running statistics)."""

    def __init__(self, module, args: tuple, kwargs: dict) -> None:
        tensors = [*args, *kwargs.values()]
        self.devices = sorted(
            {t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda}
        )
        self.buffers = [b for b in module.buffers() if not b.is_meta]

    def __enter__(self) -> None:
        self.rng = torch.random.fork_rng(devices=self.devices)
        self.rng.__enter__()
        self.saved = [(b, b.detach().clone()) for b in self.buffers]

    def __exit__(self, *exc) -> None:
        try:
            for buffer, saved in self.saved:
                buffer.detach().copy_(saved)
        finally:
            self.rng.__exit__(*exc)


def _through_dynamo(error: ShapeError) -> ShapeError:
    """The error as one dynamo lets out of its trace unwrapped (it turns any other into
    an InternalTorchDynamoError): still a ShapeError, and read `shapeguard.ShapeError`."""
    try:
        from torch._dynamo.exc import TorchRuntimeError
    except ImportError:  # another torch: the error, as it is
        return error
    kind = type(error)
    cls = _compiled_errors.get(kind)
    if cls is None:
        cls = type(kind.__name__, (kind, TorchRuntimeError), {})
        cls.__module__, cls.__qualname__ = kind.__module__, kind.__qualname__
        _compiled_errors[kind] = cls
    with contextlib.suppress(TypeError):  # a subclass with slots of its own
        error.__class__ = cls
    return error
