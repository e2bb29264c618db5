"""flash-attn's Python entry points, wrapped while a trace is active; and the one import
point for flash-attn support (the contract, re-exported from `checks/_flash_contract.py` and
`checks/_flash_varlen.py`).

While a session is open, `flash_attn.flash_attn_func` and its siblings, and every
module global bound to them (`from flash_attn import flash_attn_func`), are replaced
by wrappers that route the call through the session (`rebinding.Rebinder`, as torch's
flex_attention and varlen_attn are in `torch_entries`); they are put back when the last
session closes. Nothing is wrapped unless flash_attn was already imported by the user.
"""

import sys

from ..checks._flash_contract import (
    ENTRY_POINTS,
    FLASH_DTYPES,
    FLASH_NAMESPACES,
    KINDS,
    MAX_HEAD_DIM,
    SUSPICIOUS_HEADS,
    WRAPPED,
    Spec,
    check_dense,
    check_kvpacked,
    check_qkvpacked,
    enforce,
    import_hint,
    site_label,
    spec,
)
from ..checks._flash_varlen import (
    CuSeqlens,
    check_varlen,
    check_varlen_args,
    check_varlen_kvpacked,
    check_varlen_qkvpacked,
    cu_seqlens,
)
from .rebinding import Rebinder

__all__ = [
    "ENTRY_POINTS",
    "KINDS",
    "FLASH_DTYPES",
    "FLASH_NAMESPACES",
    "MAX_HEAD_DIM",
    "SUSPICIOUS_HEADS",
    "CuSeqlens",
    "Spec",
    "check_dense",
    "check_kvpacked",
    "check_qkvpacked",
    "check_varlen",
    "check_varlen_args",
    "check_varlen_kvpacked",
    "check_varlen_qkvpacked",
    "cu_seqlens",
    "bindings",
    "enforce",
    "forget_scan",
    "import_hint",
    "patch",
    "restore",
    "site_label",
    "spec",
]


def _loaded() -> dict[int, object]:
    """flash-attn's entry points (id -> function), noted in WRAPPED for the flash rule;
    nothing when the user has not imported flash_attn (never imported here: it needs its
    CUDA extension)."""
    module = sys.modules.get("flash_attn")
    if module is None:
        return {}
    found = {}
    for name in ENTRY_POINTS:
        func = vars(module).get(name)
        if callable(func) and not hasattr(func, "__shapeguard_original__"):
            found[id(func)] = func
    WRAPPED.update(found)
    return found


# Scanning every module's globals costs about a millisecond, and a guarded module opens a
# session on every forward: the Rebinder scans again only when a module was imported or
# flash_attn's functions changed.
_rebinder = Rebinder(_loaded, on_restore=WRAPPED.clear)
patch = _rebinder.patch
restore = _rebinder.restore
forget_scan = _rebinder.forget_scan
bindings = _rebinder.bindings  # (module dict, name, original, wrapper), while a trace is open
