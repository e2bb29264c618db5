"""shapeguard: shape bugs in PyTorch attention code, caught and explained.

Importing this package imports neither torch nor click nor flash_attn; the
names that need torch load on first use.
"""

from importlib import metadata as _metadata

from ._config import disable as disable
from ._config import disabled as disabled
from ._config import enable as enable
from ._config import is_enabled as is_enabled
from ._errors import ContractError as ContractError
from ._errors import Finding as Finding
from ._errors import ShapeError as ShapeError
from ._errors import ShapeguardInternalWarning as ShapeguardInternalWarning
from ._errors import ShapeWarning as ShapeWarning
from ._guard import guard as guard
from ._guard import is_guarded as is_guarded
from ._guard import last_trace as last_trace
from ._guard import unguard as unguard
from ._public_trace import Trace as Trace
from ._public_trace import trace as trace
from ._trace.record import Event as Event
from ._trace.record import TensorRecord as TensorRecord

# Names that need torch (or jaxtyping) load on first use: {name: (module, attribute)};
# attribute None means the submodule itself.
_LAZY = {
    "CheckReport": ("._probes.check", "CheckReport"),
    "ProbeResult": ("._probes", "ProbeResult"),
    "attention": (".attention", None),
    "check": ("._probes.check", "check"),
    "contract": ("._contract.decorator", "contract"),
    "contracts": (".contracts", None),
    "diff": ("._diff.engine", "diff"),
}


def __getattr__(name: str):
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'shapeguard' has no attribute {name!r}") from None
    import importlib

    module = importlib.import_module(module_name, __name__)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value  # resolve once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


try:
    __version__ = _metadata.version("shapeguard-attn")
except _metadata.PackageNotFoundError:  # running from a source tree
    from ._version import __version__ as __version__

__all__ = [
    "CheckReport",
    "ContractError",
    "Event",
    "Finding",
    "ProbeResult",
    "ShapeError",
    "ShapeWarning",
    "ShapeguardInternalWarning",
    "TensorRecord",
    "Trace",
    "__version__",
    "attention",
    "check",
    "contract",
    "contracts",
    "diff",
    "disable",
    "disabled",
    "enable",
    "guard",
    "is_enabled",
    "is_guarded",
    "last_trace",
    "trace",
    "unguard",
]
