"""flash-attn's Python entry points, wrapped while a trace is active; and the one import
point for flash-attn support (the contract, re-exported from `checks/_flash_contract.py` and
`checks/_flash_varlen.py`).

While a session is open, `flash_attn.flash_attn_func` and its siblings, and every
module global bound to them (`from flash_attn import flash_attn_func`), are replaced
by wrappers that route the call through the session (`rebinding.wrap`); they are put
back when the last session closes. Nothing is wrapped unless flash_attn was already
imported by the user. torch's flex_attention and varlen_attn are wrapped the same way
(`torch_entries`, on `rebinding.Rebinder`).
"""

import sys
import threading

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
from .rebinding import bound_names, wrap

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
    "enforce",
    "import_hint",
    "patch",
    "restore",
    "site_label",
    "spec",
]

_lock = threading.RLock()
_depth = 0
_bindings: list[tuple[dict, str, object, object]] = []  # (module dict, name, original, wrapper)
# Where the originals were bound at the last scan of sys.modules, and what that scan saw.
# Scanning every module's globals costs about a millisecond, and a guarded module opens a
# session on every forward: scan again only when a module was imported or flash_attn changed.
_scan_key: tuple = ()
_locations: list[tuple[dict, str]] = []


def patch() -> bool:
    """Wrap flash-attn's entry points for a session that is opening. Never raises.

    Returns True: the caller holds one reference and must pass it to `restore`.
    """
    global _depth
    with _lock:
        _depth += 1
        if _depth == 1:
            try:
                _install()
            except Exception:  # a broken module must not stop the trace from opening
                _uninstall()
        return True


def restore(held: bool) -> None:
    """Release one reference from `patch`; the last one puts every original back. Never raises."""
    global _depth
    if not held:
        return
    with _lock:
        _depth = max(0, _depth - 1)
        if _depth == 0:
            _uninstall()


def _install() -> None:
    global _scan_key
    module = sys.modules.get("flash_attn")
    if module is None:  # never import it: it needs its CUDA extension
        return
    found = {}
    for name in ENTRY_POINTS:
        func = vars(module).get(name)
        if callable(func) and not hasattr(func, "__shapeguard_original__"):
            found[id(func)] = func
    if not found:
        return
    WRAPPED.update(found)
    key = (len(sys.modules), frozenset(found))
    if key != _scan_key:
        _locations[:] = bound_names(found, list(sys.modules.values()))
        _scan_key = key
    wrappers: dict[int, object] = {}
    for namespace, name in _locations:
        value = namespace.get(name)
        original = found.get(id(value))
        if original is None or value is not original:
            continue
        wrapper = wrappers.get(id(original))
        if wrapper is None:
            wrapper = wrappers[id(original)] = wrap(original)
        namespace[name] = wrapper
        _bindings.append((namespace, name, original, wrapper))


def _uninstall() -> None:
    bindings, _bindings[:] = list(_bindings), []
    for namespace, key, original, wrapper in reversed(bindings):
        try:
            if namespace.get(key) is wrapper:  # leave a name the user rebound meanwhile
                namespace[key] = original
        except Exception:
            continue
    WRAPPED.clear()
