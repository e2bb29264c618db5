"""What a probe reports: passed, failed or skipped, with its message and deviation."""

from dataclasses import dataclass


@dataclass(slots=True)
class ProbeResult:
    """One probe's outcome.

    Attributes:
        name: the property checked, e.g. "batch independence".
        status: "passed", "failed" or "skipped".
        message: what was done and what came out, in the house style.
        deviation: how far the output moved, relative to its scale (None when not run).
        tolerance: the largest deviation accepted, on the same scale.
        op: the traced op a failure points to, "op at file:line (module)".
    """

    name: str
    status: str
    message: str
    deviation: float | None = None
    tolerance: float | None = None
    op: str = ""

    @property
    def passed(self) -> bool:
        """False only for a failed probe (a skipped one does not fail the check)."""
        return self.status != "failed"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "message": self.message,
            "deviation": self.deviation,
            "tolerance": self.tolerance,
            "op": self.op,
        }


def skipped(name: str, why: str) -> ProbeResult:
    """A probe that did not run, and why."""
    return ProbeResult(name, "skipped", why)
