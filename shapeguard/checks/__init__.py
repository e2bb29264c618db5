"""The checks registry: op name -> the checkers of the op families that apply to it.

A checker takes an `OpCall` and yields `Violation`s; it never raises them
itself, so the session decides (raise, warn, record) with the user's context.
Keyed by op name, so `torch.matmul`, `Tensor.matmul` and `@` share checkers.
Each family module lists its op names in `OPS` and defines `check(call)`;
add a family by naming its module in `FAMILIES`.
"""

import importlib
from collections.abc import Callable, Iterator

from .._errors import Violation

Checker = Callable[..., Iterator[Violation]]

FAMILIES = (
    "matmul", "heads_view", "elementwise", "softmax", "sdpa", "mha", "flash",
    "layout", "mask_semantics",
)

_REGISTRY: dict[str, tuple[Checker, ...]] | None = None


def _build() -> dict[str, tuple[Checker, ...]]:
    registry: dict[str, list[Checker]] = {}
    for name in FAMILIES:
        family = importlib.import_module(f"{__name__}.{name}")
        for op in family.OPS:
            registry.setdefault(op, []).append(family.check)
    return {op: tuple(checkers) for op, checkers in registry.items()}


def checkers_for(op: str) -> tuple[Checker, ...]:
    """The checkers to run before `op`, in family order (empty when none)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build()
    return _REGISTRY.get(op, ())
