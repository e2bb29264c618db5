"""The rows of `shapeguard check`'s summary: the trace's result, then each semantic probe's.

A row is `(check, status, detail)` with status `pass`, `FAIL`, `inconclusive` (a probe
that proves nothing either way: the detail says why; it fails nothing), `n/a` (one whose
property does not hold for this kind of module by design, `applicable: false`) or `skip`
(the probes did not run at all: `--device meta`, a failed trace); details are the full
messages of failures, printed under the table, then the summary line (`Summary.line`).
The probes come from `probe_runner` (`_probes.check.run_probes`), whose `CheckReport` the
summary reads (`probe_rows`).
"""

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._trace.finding_groups import grouped
from ..report.text import summary_line

if TYPE_CHECKING:  # the probes import torch: read only once they have run
    from .._probes.report import CheckReport

# A probe that proves nothing either way: shown with its reason, it fails nothing.
INCONCLUSIVE = "inconclusive"


@dataclass(slots=True)
class Summary:
    """`shapeguard check`'s verdict: the rows of its table, the full messages of the
    failures, and the probe runner's own report (a `CheckReport`) when it ran."""

    rows: list[tuple[str, str, str]]
    details: list[str] = field(default_factory=list)
    report: "CheckReport | None" = None

    @property
    def failures(self) -> int:
        return sum(1 for _, status, _ in self.rows if status == "FAIL")

    @property
    def inconclusive(self) -> int:
        """The rows that prove nothing either way (they fail nothing)."""
        return sum(1 for _, status, _ in self.rows if status == INCONCLUSIVE)

    def line(self) -> str:
        """The summary under the table: how many checks passed, failed, were inconclusive
        or did not apply; the exit status follows the failures alone."""
        counts: dict[str, int] = {}
        for _, status, _ in self.rows:
            counts[status] = counts.get(status, 0) + 1
        words = [("pass", "passed"), ("FAIL", "failed"), (INCONCLUSIVE, INCONCLUSIVE)]
        words += [("n/a", "n/a"), ("skip", "skipped")]
        parts = [f"{counts[key]} {word}" for key, word in words if counts.get(key)]
        verdict = "failed" if self.failures else "passed"
        if self.report is not None and self.report.verdict == INCONCLUSIVE and not self.failures:
            verdict = "inconclusive: no probe could conclude, nothing failed"
        elif not self.failures and self.inconclusive:
            verdict += f" ({self.inconclusive} inconclusive: see the reasons above)"
        return f"{len(self.rows)} checks: {', '.join(parts)}; {verdict}"

    def mode_text(self, width: int | None = None) -> str:
        """The probes' line on the train/eval mode, right under the table
        (`CheckReport.mode_line`), wrapped to `width` with its newline; "" where the module
        was in eval mode or no probe ran."""
        import textwrap

        line = self.report.mode_line() if self.report is not None else ""
        if not line:
            return ""
        return (textwrap.fill(line, width, subsequent_indent="  ") if width else line) + "\n"

    def to_dict(self) -> dict:
        """The `check` object of the JSON schema (docs/json-schema.md)."""
        return {
            "passed": not self.failures,
            "failed": self.failures,
            "inconclusive": self.inconclusive,
            "results": [
                {"name": name, "status": status, "detail": detail}
                for name, status, detail in self.rows
            ],
            "details": list(self.details),
            "probes": self.report.to_dict() if self.report is not None else None,
        }


def summary_rows(model, inputs, run, device: str, *, find_runner, progress=None) -> Summary:
    """The summary of one traced forward (`_run.Run`) and the probes run after it.

    Args:
        find_runner: returns the probe runner (`probe_runner`), or None; called only
            when the probes can run.
        progress: `progress(model)`, a context manager around the probes.
    """
    trace = run.trace
    rows = [("trace", "FAIL" if trace.findings else "pass", summary_line(trace))]
    groups = grouped(trace.findings)  # a finding repeated across layers: one row
    rows += [(g.first.kind, "FAIL", g.headline) for g in groups]
    details = [g.message for g in groups]
    probes = _run_probes(model, inputs, run, device, find_runner, progress)
    return Summary(rows + probes.rows, details + probes.details, probes.report)


def _run_probes(model, inputs, run, device: str, find_runner, progress) -> Summary:
    from .._errors import ShapeError, first_line

    if device == "meta":
        return Summary(
            [("semantic probes", "skip", "probes compare real values; run without --device meta")]
        )
    if run.failed:
        return Summary([("semantic probes", "skip", "the trace failed; fix that first")])
    runner = find_runner()
    if runner is None:
        return Summary([("semantic probes", "skip", "not available in this version of shapeguard")])
    try:
        with progress(model) if progress else contextlib.nullcontext():
            report = runner(model, inputs.args, inputs.kwargs)
    except ShapeError as error:
        return Summary([(error.kind, "FAIL", error.relation)], [error.render()])
    except Exception as error:
        # The probes' own crash says nothing about the model: inconclusive, never a failure.
        first = first_line(error)
        why = f"the probes crashed ({type(error).__name__}: {first}): shapeguard's fault, not the model's"
        return Summary([("semantic probes", INCONCLUSIVE, why)])
    rows = probe_rows(report)
    details = [message for _, status, message in rows if status == "FAIL" and "\n" in message]
    rows = [
        (name, status, message.splitlines()[0] if message else "") for name, status, message in rows
    ]
    return Summary(rows, details, report)


def probe_runner():
    """The semantic probes as `f(model, args: tuple, kwargs: dict)`: `check.run_probes`,
    imported when `shapeguard check` runs them (they import torch)."""
    import importlib

    return importlib.import_module("shapeguard._probes.check").run_probes


def probe_rows(report: "CheckReport") -> list[tuple[str, str, str]]:
    """(name, status, message) for each semantic probe of the probes' `CheckReport`, in
    the summary's words (a probe that does not apply is "n/a": nothing was missed). Not
    the report's own "shape checks" result: it repeats the trace's row."""
    from .._probes.result import FAILED, INCONCLUSIVE, PASSED, SKIPPED

    words = {PASSED: "pass", FAILED: "FAIL", INCONCLUSIVE: INCONCLUSIVE, SKIPPED: "n/a"}
    return [(result.name, words[result.status], result.message) for result in report.probes]
