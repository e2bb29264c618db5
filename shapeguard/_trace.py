"""`shapeguard.trace`: check and record every tensor op of a block or of one forward."""

from . import _config
from ._record import Trace


def trace(model=None, /, *args, mode: str = "raise", strict: bool = False, **kwargs) -> Trace:
    """Trace a block of code, or one forward of `model`.

    With no model, returns a `Trace` to use as a context manager: every torch
    function, Tensor method and operator inside the block is checked and recorded,
    in any code, guarded or not. With a model, runs `model(*args, **kwargs)` once
    inside a trace and returns the finished Trace (shapes only: keep the output
    by calling the model yourself inside `with shapeguard.trace():`).

    Args:
        model: an `nn.Module` (or any callable) to run once; omit for a context manager.
        *args, **kwargs: the inputs of that forward.
        mode: "raise" or "warn", as for `guard`.
        strict: turn ShapeWarnings into errors.

    Examples:
        >>> import torch, shapeguard
        >>> t = shapeguard.trace(torch.nn.Linear(3, 4), torch.zeros(2, 3))
        >>> t.shape_of("output") is None, t.events[0].op, t.events[0].outputs[0].shape
        (True, 'linear', (2, 4))
    """
    record = Trace(mode=_config.validate_mode(mode), strict=bool(strict))
    if model is None:
        if args or kwargs:
            from ._errors import ContractError

            raise ContractError("shapeguard.trace() takes inputs only together with a model")
        return record
    if not _config.is_enabled():
        model(*args, **kwargs)
        return record
    from ._tracing import tracing

    with tracing(record, model, args, kwargs):
        model(*args, **kwargs)
    return record
