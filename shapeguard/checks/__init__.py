"""The checks registry: op name -> checker for its op family.

A checker takes an `OpCall` and yields `Violation`s; it never raises them
itself, so the session decides (raise, warn, record) with the user's context.
Keyed by op name, so `torch.matmul`, `Tensor.matmul` and `@` share one checker.
"""

from collections.abc import Callable, Iterator

from .._errors import Violation

Checker = Callable[..., Iterator[Violation]]

_REGISTRY: dict[str, Checker] | None = None


def _build() -> dict[str, Checker]:
    from . import elementwise, heads_view, matmul, mha, sdpa, softmax

    registry: dict[str, Checker] = {}
    for family in (matmul, heads_view, elementwise, softmax, sdpa, mha):
        for name in family.OPS:
            registry[name] = family.check
    return registry


def checker_for(op: str) -> Checker | None:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build()
    return _REGISTRY.get(op)
