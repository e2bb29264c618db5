"""The off switch and the modes. Read at call time, never cached at import."""

import contextlib
import os
import threading

MODES = ("raise", "warn")

_disabled_by_api = False
# `disabled()` blocks, per thread: one thread's block never switches another thread off.
_local = threading.local()


def disable() -> None:
    """Turn every guard and trace into a pass-through until `enable()` is called."""
    global _disabled_by_api
    _disabled_by_api = True


def enable() -> None:
    """Undo `disable()`. `SHAPEGUARD=0` in the environment still wins."""
    global _disabled_by_api
    _disabled_by_api = False


@contextlib.contextmanager
def disabled():
    """Checks off inside the block, in this thread only; on again after it, also when
    the block raises. Blocks nest.

    >>> import shapeguard
    >>> with shapeguard.disabled():
    ...     shapeguard.is_enabled()
    False
    >>> shapeguard.is_enabled()
    True
    """
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def is_enabled() -> bool:
    """Whether checks run now: `SHAPEGUARD=0`, `disable()` and a `disabled()` block in
    this thread turn them off."""
    if _disabled_by_api or getattr(_local, "depth", 0):
        return False
    return os.environ.get("SHAPEGUARD", "1").strip().lower() not in ("0", "false", "off", "no")


def validate_mode(mode: str) -> str:
    from ._errors import ContractError

    if mode not in MODES:
        raise ContractError(f"mode={mode!r} is not a shapeguard mode; use one of {MODES}")
    return mode
