"""What a probe reports: the property holds, is violated, or the run proves nothing.

A probe has three outcomes, and a fourth for a property with nothing to act on:

- "passed": the edited run left the outputs where the property says they stay;
- "failed": a counterexample: an edited input that the unmodified module runs, and
  outputs that moved beyond tolerance where the property says they must not;
- "inconclusive": the probe proves nothing either way, and says why (the module
  rejects the edited input, its outputs are not finite, its structure does not promise
  the property, randomness or state, the probe's own crash);
- "skipped" with `applicable=False`: not applicable, the property does not hold for
  this kind of module by design (shown as "n/a").
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .reach_record import MeasuredReach

PASSED = "passed"
FAILED = "failed"
INCONCLUSIVE = "inconclusive"
SKIPPED = "skipped"  # not applicable (`applicable` is False)
STATUSES = (PASSED, FAILED, INCONCLUSIVE, SKIPPED)


@dataclass(slots=True)
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: the property checked, e.g. "batch independence".
        status: "passed", "failed", "inconclusive", or "skipped" (not applicable).
        message: what was done and what came out, in the house style; for an
            inconclusive or skipped probe, why, on its first line.
        deviation: how far the output moved, relative to its scale (None when not run;
            infinite when NaN appeared in one run only or the shapes differ).
        tolerance: the largest deviation accepted, on the same scale.
        op: the traced op a failure points to, "op at file:line (module)".
        applicable: False for a probe whose property does not hold for this kind of
            module by design (no mask to pad, not causal, no cache): nothing was missed.
        reach: what the reach probe measured (`reach_record.MeasuredReach`), for the
            JSON and the drawing; None for every other probe.
    """

    name: str
    status: str
    message: str
    deviation: float | None = None
    tolerance: float | None = None
    op: str = ""
    applicable: bool = True
    reach: "MeasuredReach | None" = None

    @property
    def passed(self) -> bool:
        """False only for a failed probe (an inconclusive or skipped one does not fail
        the check)."""
        return self.status != FAILED

    @property
    def ran(self) -> bool:
        """Whether the probe applied to the module (every status but not applicable)."""
        return self.status != SKIPPED

    @property
    def conclusive(self) -> bool:
        """Whether the probe says the property holds or is violated."""
        return self.status in (PASSED, FAILED)

    @property
    def reason(self) -> str | None:
        """Why an inconclusive or not applicable probe said nothing (the first line)."""
        if self.status in (INCONCLUSIVE, SKIPPED):
            return self.message.splitlines()[0] if self.message else ""
        return None

    def to_dict(self) -> dict:
        """The result as JSON-ready values (see docs/json-schema.md, "Check report")."""
        dev = self.deviation
        diverged = dev is not None and not math.isfinite(dev)
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "applicable": self.applicable,
            "message": self.message,
            "reason": self.reason,
            "hint": _hint(self.message) if self.status == FAILED else None,
            "deviation": None if diverged else dev,
            "diverged": diverged,
            "tolerance": self.tolerance,
            "op": self.op,
            "reach": self.reach.to_dict() if self.reach is not None else None,
        }


def _hint(message: str) -> str | None:
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("hint: "):
            return text[len("hint: ") :]
    return None


def inconclusive(name: str, why: str, *, op: str = "", deviation: float | None = None):
    """A probe that proves nothing either way, and why (`why`'s first line is the reason)."""
    return ProbeResult(name, INCONCLUSIVE, why, deviation=deviation, op=op)


def not_applicable(name: str, why: str) -> ProbeResult:
    """A probe whose property does not hold for this kind of module by design."""
    return ProbeResult(name, SKIPPED, why, applicable=False)


def skipped(name: str, why: str, *, applicable: bool = True) -> ProbeResult:
    """A probe that did not conclude: inconclusive (`applicable`), or not applicable.
    Kept for callers of the two-outcome API; new code says which it means."""
    return inconclusive(name, why) if applicable else not_applicable(name, why)


def demoted(result: ProbeResult, why: str) -> ProbeResult:
    """`result` made inconclusive for `why` (a conclusive result that proves nothing:
    outputs that are not finite, randomness, state); the probe's own finding kept below."""
    if not result.conclusive:
        return result
    first = result.message.splitlines()[0] if result.message else ""
    said = "passed" if result.status == PASSED else "failed"
    return ProbeResult(
        result.name,
        INCONCLUSIVE,
        f"{why}\n  the probe {said}: {first}",
        result.deviation,
        result.tolerance,
        result.op,
        reach=result.reach,
    )
