"""The checks registry: rules registered on the op table, with the kinds they raise.

A rule is a function of an `OpCall` that yields `Violation`s (the type `Checker`); it never raises them
itself, so the session decides (raise, warn, record) with the user's context. It
is registered on ops of the op table (`_ops.py`) with the kinds it may yield and
the severity of each::

    @rule(_ops.by_name("softmax"), kinds={"softmax_axis": WARNING})
    def softmax_over_keys(call: CallView) -> Iterator[Violation]: ...

Every module of this package is a family of rules, loaded on first use; a rule
registered twice, or an op the table does not know, is an error. `KINDS` is the
catalogue: every kind shapeguard can report, the family that owns it, and its
severities (kinds raised outside a rule, by contracts or the session, are
declared with `declare` in `declared.py`).
"""

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from .. import _ops
from .._errors import Violation
from .._values import is_tensor
from ._view import CallView

ERROR = "error"
WARNING = "warning"
_SEVERITIES = (ERROR, WARNING)

# What a rule is: a function of the intercepted call, read through the read-only
# `CallView` (the session and the composites pass their `OpCall`), yielding the violations
# it finds. Every checker is annotated
# `def name(call: CallView) -> Iterator[Violation]`, so `rule` checks it against this type.
Checker = Callable[[CallView], Iterator[Violation]]


@dataclass(frozen=True, slots=True)
class Rule:
    """A checker, the canonical names of the ops it checks, and the kinds it yields."""

    check: Checker
    family: str
    ops: tuple[str, ...]
    kinds: Mapping[str, frozenset[str]]  # kind -> the severities it may have
    order: int
    # The rule reads only calls whose first `operands` positional arguments are tensors
    # (`t + u`, not `t * 0.5`): the session shows it no other, so a replayed step with
    # other numbers in those places has the same verdict (see `_replay_match.loose_numbers`).
    operands: int = 0


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    families: frozenset[str]
    severities: frozenset[str]


_RULES: list[Rule] = []
_BY_SPELLING: dict[str, tuple[Rule, ...]] | None = None
# The same index without the rules of tensor parallelism (`tp.py`), for a process whose
# default process group is not initialized: without one there is no DeviceMesh, so no
# DTensor, and no collective ran, and every one of those rules returns at once.
_SINGLE_PROCESS: dict[str, tuple[Rule, ...]] | None = None
_DISTRIBUTED_FAMILY = "tp"
_DECLARED: dict[str, tuple[set[str], set[str]]] = {}
_loaded = False


def _family_of(module: str) -> str:
    return module.rsplit(".", 1)[-1]


Severities = str | tuple[str, ...]


def _normalize(kinds: Mapping[str, Severities]) -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for kind, given in kinds.items():
        severities = frozenset((given,) if isinstance(given, str) else given)
        if not severities or not severities <= set(_SEVERITIES):
            raise RuntimeError(f"kind {kind!r}: severities {given!r} are not in {_SEVERITIES}")
        out[kind] = severities
    return out


def _declare(family: str, kinds: Mapping[str, frozenset[str]]) -> None:
    for kind, severities in kinds.items():
        families, known = _DECLARED.setdefault(kind, (set(), set()))
        families.add(family)
        known.update(severities)


def rule(
    *ops: _ops.Op, kinds: Mapping[str, Severities], order: int = 0, operands: int = 0
) -> Callable[[Checker], Checker]:
    """Register the decorated checker on `ops` (entries of the op table).

    `kinds` maps each kind the checker may yield to its severity (or the severities it
    chooses between, the violation then saying which); `order` runs the contract of an op
    (0, the loud errors) before the rules about silent bugs (1, 2); `operands` > 0 runs the
    checker only on calls whose first `operands` positional arguments are all tensors.
    """
    declared = _normalize(kinds)
    for op in ops:
        # `declared`, not `lookup`: the placeholder op of an unlisted name is not in the table.
        if not isinstance(op, _ops.Op) or _ops.declared(op.name) is not op:
            raise RuntimeError(f"rule on {op!r}: not an op of the op table")

    def register(check: Checker) -> Checker:
        global _BY_SPELLING, _SINGLE_PROCESS
        family = _family_of(check.__module__)
        for known in _RULES:
            if known.check.__module__ == check.__module__ and (
                known.check.__qualname__ == check.__qualname__
            ):
                raise RuntimeError(
                    f"rule {family}.{check.__qualname__} is registered twice (duplicate registration)"
                )
        _RULES.append(Rule(check, family, tuple(op.name for op in ops), declared, order, operands))
        _declare(family, declared)
        _BY_SPELLING = _SINGLE_PROCESS = None
        return check

    return register


def declare(family: str, kinds: Mapping[str, Severities]) -> None:
    """Declare kinds reported outside a rule (the session, contracts, flash-attn's
    entry points), so the catalogue knows them too."""
    _declare(family, _normalize(kinds))


# The check modules load once, on the first trace; threads tracing at once wait for it
# (a half-loaded registry would miss rules for the rest of the process).
_loading = threading.RLock()


def _load() -> None:
    global _loaded
    with _loading:
        if _loaded:
            return
        _loaded = True  # a check module that asks for rules while importing sees these
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")


def _index(distributed: bool = True) -> dict[str, tuple[Rule, ...]]:
    global _BY_SPELLING, _SINGLE_PROCESS
    with _loading:
        _load()
        if _BY_SPELLING is None or _SINGLE_PROCESS is None:
            table: dict[str, list[Rule]] = {}
            for r in sorted(_RULES, key=lambda r: (r.order, r.family)):
                for name in r.ops:
                    for spelling in _ops.lookup(name).spellings:
                        table.setdefault(spelling, []).append(r)
            _BY_SPELLING = {spelling: tuple(rules) for spelling, rules in table.items()}
            _SINGLE_PROCESS = {
                spelling: tuple(r for r in rules if r.family != _DISTRIBUTED_FAMILY)
                for spelling, rules in _BY_SPELLING.items()
            }
        return _BY_SPELLING if distributed else _SINGLE_PROCESS


def rules_for(spelling: str, distributed: bool = True) -> tuple[Rule, ...]:
    """The rules to run before an op, contract first (empty when none); without those of
    tensor parallelism when `distributed` is False (`distributed_now`)."""
    index = _BY_SPELLING if distributed else _SINGLE_PROCESS
    if index is None or not _loaded:
        index = _index(distributed)
    return index.get(spelling, ())


def distributed_now() -> bool:
    """Whether the default process group is initialized: what any DTensor (through its
    DeviceMesh) and any collective needs. Read per op, so a process group initialized in
    the middle of a trace (a test that sets up its mesh in its body) is seen at once."""
    probe = _initialized
    if probe is None:
        probe = _probe()
    return probe()


def _probe() -> Callable[[], bool]:
    global _initialized
    import torch.distributed as dist  # the first trace has torch imported already

    _initialized = dist.is_initialized if dist.is_available() else _never
    return _initialized


def _never() -> bool:
    return False


_initialized: Callable[[], bool] | None = None


def applies(r: Rule, args: tuple) -> bool:
    """Whether rule `r` reads a call with these positional arguments (`Rule.operands`)."""
    n = r.operands
    if not n:
        return True
    return len(args) >= n and all(is_tensor(a) for a in args[:n])


def leading_operands(args: tuple) -> int:
    """How many of the leading positional arguments are tensors, as `applies` reads them:
    `applies(r, args)` is `leading_operands(args) >= r.operands` for a rule with operands."""
    count = 0
    for a in args:
        if not is_tensor(a):
            break
        count += 1
    return count


def checkers_for(spelling: str) -> tuple[Checker, ...]:
    return tuple(r.check for r in rules_for(spelling))


def kinds() -> dict[str, Kind]:
    """The catalogue: every kind shapeguard reports."""
    _load()
    return {
        name: Kind(name, frozenset(families), frozenset(severities))
        for name, (families, severities) in sorted(_DECLARED.items())
    }


def severity(r: Rule, violation: Violation) -> str:
    """The severity `r` declares for the violation's kind (an undeclared kind is a bug)."""
    declared = r.kinds.get(violation.kind)
    if declared is None:
        raise RuntimeError(
            f"rule {r.family}.{r.check.__qualname__} yielded kind {violation.kind!r}, "
            f"which it does not declare ({', '.join(r.kinds)})"
        )
    if violation.severity in declared:
        return violation.severity
    if len(declared) == 1:
        return next(iter(declared))
    raise RuntimeError(
        f"rule {r.family}.{r.check.__qualname__} yielded {violation.kind!r} as "
        f"{violation.severity!r}; it declares {sorted(declared)}"
    )
