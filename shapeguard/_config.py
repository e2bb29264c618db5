"""The off switch and the modes. Read at call time, never cached at import."""

import os

MODES = ("raise", "warn")

_disabled_by_api = False


def disable() -> None:
    """Turn every guard and trace into a pass-through until `enable()` is called."""
    global _disabled_by_api
    _disabled_by_api = True


def enable() -> None:
    """Undo `disable()`. `SHAPEGUARD=0` in the environment still wins."""
    global _disabled_by_api
    _disabled_by_api = False


def is_enabled() -> bool:
    """Whether checks run now: `SHAPEGUARD=0` and `disable()` both turn them off."""
    if _disabled_by_api:
        return False
    return os.environ.get("SHAPEGUARD", "1").strip().lower() not in ("0", "false", "off", "no")


def validate_mode(mode: str) -> str:
    from ._errors import ContractError

    if mode not in MODES:
        raise ContractError(f"mode={mode!r} is not a shapeguard mode; use one of {MODES}")
    return mode


def validate_max_events(value) -> int:
    from ._errors import ContractError

    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ContractError(f"max_events={value!r} must be a whole number of events, 0 or more")
    return value
