"""The off switch and the modes. Read at call time, never cached at import."""

import contextlib
import os
import threading

MODES = ("raise", "warn")

# Set by `disable()`, cleared by `enable()`: read by the interceptor on every op (an
# attribute read, not a call).
disabled_by_api = False
# `disabled()` / `forced_on()` blocks, per thread: one thread's block never switches
# another thread.
_local = threading.local()


def disable() -> None:
    """Turn every guard and trace into a pass-through until `enable()` is called."""
    global disabled_by_api
    disabled_by_api = True


def enable() -> None:
    """Undo `disable()`. `SHAPEGUARD=0` in the environment still wins."""
    global disabled_by_api
    disabled_by_api = False


def disabled():
    """Checks off inside the block, in this thread only; on again after it, also when
    the block raises. Blocks nest; the innermost block decides.

    >>> import shapeguard
    >>> with shapeguard.disabled():
    ...     shapeguard.is_enabled()
    False
    >>> shapeguard.is_enabled()
    True
    """
    return _switched(False)


def forced_on():
    """Checks on inside the block in this thread, whatever `disable()` or an outer
    `disabled()` block said (`SHAPEGUARD=0` still wins): for shapeguard's own traced runs,
    such as the forwards `check` asks for explicitly."""
    return _switched(True)


@contextlib.contextmanager
def _switched(on: bool):
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(on)
    try:
        yield
    finally:
        stack.pop()


def is_enabled() -> bool:
    """Whether checks run now: `SHAPEGUARD=0` turns them off; else the innermost
    `disabled()` block of this thread, else `disable()`."""
    stack = _local.__dict__.get("stack")
    if stack:
        if not stack[-1]:
            return False
    elif disabled_by_api:
        return False
    return os.environ.get("SHAPEGUARD", "1").strip().lower() not in ("0", "false", "off", "no")


def internal_errors_raise() -> bool:
    """Whether a failure of shapeguard's own code is raised (`SHAPEGUARD_INTERNAL_ERRORS=raise`,
    as shapeguard's own test suite runs) instead of contained (the default: the op runs as
    without shapeguard, the failure is kept on the trace and warned once). Read only when
    such a failure happens."""
    return os.environ.get("SHAPEGUARD_INTERNAL_ERRORS", "").strip().lower() == "raise"


def validate_mode(mode: str) -> str:
    from ._errors import ContractError, ContractTypeError

    if mode not in MODES:
        wrong = ContractError if isinstance(mode, str) else ContractTypeError
        raise wrong(f"mode={mode!r} is not a shapeguard mode; use one of {MODES}")
    return mode


def validate_strict(value) -> bool:
    from ._errors import ContractTypeError

    if not isinstance(value, bool):
        raise ContractTypeError(f"strict={value!r} must be True or False")
    return value


def validate_max_events(value) -> int:
    from ._errors import ContractError, ContractTypeError

    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        wrong = ContractError if isinstance(value, int) and value < 0 else ContractTypeError
        raise wrong(f"max_events={value!r} must be a whole number of events, 0 or more")
    return value
