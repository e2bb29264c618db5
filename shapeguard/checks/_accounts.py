"""Accounts one rule family gives of a failure another family's rule finds.

A generic rule that finds a failure asks here whether a more specific family explains it,
instead of importing that family: tensor parallelism (`tp.py`) registers its account of a
view's wrong element count (the global head count on a local shard) and of heads carved
out of the sequence axis (a local shard viewed with the global count), and the view rules
(`heads_view`, `_regroup_names`, `_regroup_tokens`) ask for them. The dependency points
from the specific family to the generic rule. Every family is loaded before the first
rule runs (`checks._load`), so the registry is complete when asked.
"""

from collections.abc import Callable
from typing import Any

from .._errors import Violation
from ._view import CallView

# (call, the tensor viewed, the target sizes, the view as written, its label) -> the
# violation that explains the wrong element count, or None.
CountAccount = Callable[[CallView, Any, Any, str, str], Violation | None]
# (call, the tensor viewed, its label, the head count the view asks, if known) -> the hint
# that explains heads carved out of the sequence axis, or None.
CarveAccount = Callable[[CallView, Any, str, int | None], str | None]

_COUNT: list[CountAccount] = []
_CARVE: list[CarveAccount] = []


def accounts_for_count(account: CountAccount) -> CountAccount:
    """Register an account of a view's wrong element count (a decorator)."""
    _COUNT.append(account)
    return account


def accounts_for_carve(account: CarveAccount) -> CarveAccount:
    """Register an account of heads carved out of the sequence axis (a decorator)."""
    _CARVE.append(account)
    return account


def count_account(call: CallView, x, target, expr: str, label: str) -> Violation | None:
    """The first registered account of the wrong element count of `expr`, or None."""
    for account in _COUNT:
        found = account(call, x, target, expr, label)
        if found is not None:
            return found
    return None


def carve_account(call: CallView, x, label: str, count: int | None = None) -> str | None:
    """The first registered account of `label`'s heads carved out of its sequence axis
    (`count` heads asked, when known), for the hint; None when none explains it."""
    for account in _CARVE:
        found = account(call, x, label, count)
        if found is not None:
            return found
    return None
