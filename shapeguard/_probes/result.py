"""What a probe reports: passed, failed or skipped, with its message and deviation."""

import math
from dataclasses import dataclass


@dataclass(slots=True)
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: the property checked, e.g. "batch independence".
        status: "passed", "failed" or "skipped".
        message: what was done and what came out, in the house style; for a skipped
            probe, why it did not run.
        deviation: how far the output moved, relative to its scale (None when not run;
            infinite when NaN appeared in one run only or the shapes differ).
        tolerance: the largest deviation accepted, on the same scale.
        op: the traced op a failure points to, "op at file:line (module)".
        applicable: False for a probe skipped because its property does not hold for
            this kind of module by design (no mask to pad, positional terms for token
            permutation, not causal): nothing was missed. True for a probe that ran, or
            that could not run on these inputs (say, sizes that coincide).
    """

    name: str
    status: str
    message: str
    deviation: float | None = None
    tolerance: float | None = None
    op: str = ""
    applicable: bool = True

    @property
    def passed(self) -> bool:
        """False only for a failed probe (a skipped one does not fail the check)."""
        return self.status != "failed"

    @property
    def ran(self) -> bool:
        return self.status != "skipped"

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
            "reason": self.message.splitlines()[0] if self.status == "skipped" else None,
            "hint": _hint(self.message) if self.status == "failed" else None,
            "deviation": None if diverged else dev,
            "diverged": diverged,
            "tolerance": self.tolerance,
            "op": self.op,
        }


def _hint(message: str) -> str | None:
    for line in message.splitlines():
        text = line.strip()
        if text.startswith("hint: "):
            return text[len("hint: ") :]
    return None


def skipped(name: str, why: str, *, applicable: bool = True) -> ProbeResult:
    """A probe that did not run, and why (`applicable=False`: its property does not
    hold for this kind of module, so nothing was missed)."""
    return ProbeResult(name, "skipped", why, applicable=applicable)


def not_applicable(name: str, why: str) -> ProbeResult:
    return skipped(name, why, applicable=False)
