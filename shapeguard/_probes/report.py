"""`CheckReport`: what `check` found, as a table, a verdict and JSON."""

from dataclasses import dataclass, field
from typing import IO, cast

from .result import FAILED, INCONCLUSIVE, PASSED, SKIPPED, ProbeResult

# 2: a probe's status is "passed", "failed", "inconclusive" (with its reason) or
# "skipped" (only for a probe that does not apply, `applicable: false`).
SCHEMA_VERSION = 2

# The table's word for each status, and its style.
WORDS = {PASSED: "passed", FAILED: "failed", INCONCLUSIVE: "inconclusive", SKIPPED: "n/a"}
STYLES = {PASSED: "green", FAILED: "bold red", INCONCLUSIVE: "magenta", SKIPPED: "dim"}


@dataclass(slots=True)
class CheckReport:
    """What `check` found: the trace's findings as one result, then one result per probe.

    Attributes:
        model: the module's class name.
        results: `ProbeResult`s (name, status, message, deviation, tolerance, op).
        findings: the trace's `Finding`s.
        dtype: the dtype the probes ran in ("float64" unless the module refused it; ""
            when no probe ran).
        training: (modules in train mode, modules) of the caller's module as given; the
            probes run it in eval mode either way (`mode_line`).
    """

    model: str
    results: list[ProbeResult] = field(default_factory=list)
    findings: list = field(default_factory=list)
    dtype: str = ""
    training: tuple[int, int] = (0, 0)

    @property
    def passed(self) -> bool:
        """True when no probe failed and the trace found nothing (an inconclusive probe
        does not fail the check; see `verdict`)."""
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[ProbeResult]:
        return [r for r in self.results if not r.passed]

    @property
    def inconclusive(self) -> list[ProbeResult]:
        """The results that prove nothing either way, each with its reason."""
        return [r for r in self.results if r.status == INCONCLUSIVE]

    @property
    def probes(self) -> list[ProbeResult]:
        """The semantic probes' results (every result but the trace's)."""
        return [r for r in self.results if r.name != "shape checks"]

    @property
    def verdict(self) -> str:
        """ "failed" (a counterexample, or a finding), "passed" (a probe passed and none
        failed; `summary` says how many were inconclusive), "inconclusive" (none passed
        or failed, some could not conclude), or "not probed" (no probe applied)."""
        if not self.passed:
            return "failed"
        statuses = {r.status for r in self.probes}
        if PASSED in statuses:
            return "passed"
        if INCONCLUSIVE in statuses:
            return "inconclusive"
        return "not probed"

    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in (PASSED, FAILED, INCONCLUSIVE, SKIPPED)}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        return counts

    def summary(self) -> str:
        """The last line of the table: how many checks held, failed, were inconclusive
        or did not apply, and the verdict."""
        counts = self.counts()
        where = f" in {self.dtype}" if self.dtype else ""
        parts = [f"{counts[PASSED]} passed"]
        if counts[FAILED]:
            parts.append(f"{counts[FAILED]} failed")
        if counts[INCONCLUSIVE]:
            parts.append(f"{counts[INCONCLUSIVE]} inconclusive")
        if counts[SKIPPED]:
            parts.append(f"{counts[SKIPPED]} n/a")
        head = f"{len(self.results)} checks{where}: {', '.join(parts)}"
        verdict = self.verdict
        if verdict == "not probed":
            return f"{head}; no probe applied, so only the shape checks passed"
        if verdict == "inconclusive":
            return f"{head}; inconclusive: no probe could conclude, nothing failed"
        return f"{head}; {verdict}"

    def mode(self) -> dict:
        """The train/eval mode the module was given in and the one the probes ran it in
        (the `mode` field of the JSON)."""
        training, modules = self.training
        given = "eval" if not training else "train" if training == modules else "mixed"
        return {"given": given, "probed": "eval", "training_modules": training, "modules": modules}

    def mode_line(self) -> str:
        """The line under the table where the module was given in train mode: the probes
        ran it in eval mode (dropout off, batch norms on their running statistics), and
        its mode is restored after; "" where it was in eval mode already."""
        training, modules = self.training
        if not training:
            return ""
        some = "" if training == modules else f" ({training} of its {modules} modules)"
        return (
            f"mode: the probes ran the module in eval mode (dropout off); it was given in "
            f"train mode{some} and is left so"
        )

    def render(self, width: int | None = 100, *, color: bool = False) -> str:
        """The report as a table (plain text unless `color`), the mode line, then each
        failure in full and the summary line."""
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"shapeguard check: {self.model}", title_justify="left")
        table.add_column("probe", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("deviation", justify="right", no_wrap=True)
        table.add_column("detail")
        for r in self.results:
            dev = "" if r.deviation is None else f"{r.deviation:.1e}"
            detail = r.message.splitlines()[0] if r.status != FAILED else (r.op or "see below")
            word = WORDS.get(r.status, r.status)
            table.add_row(r.name, Text(word, style=STYLES.get(r.status, "")), dev, Text(detail))
        console = Console(
            width=width or 100,
            color_system="auto" if color else None,
            force_terminal=color,
            record=True,
            file=cast(IO[str], _Sink()),  # rich only writes to it and flushes it
        )
        console.print(table)
        if self.mode_line():
            console.print(Text(self.mode_line()))
        for r in self.failed:
            console.print(Text(f"{r.name}: {r.message}"), soft_wrap=True)
        console.print(Text(self.summary()))
        return console.export_text(styles=color).rstrip() + "\n"

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict:
        """The report as JSON-ready values: every probe's result, the trace's findings
        and the verdict (schema "shapeguard.check", docs/json-schema.md)."""
        from .._trace.finding_groups import grouped
        from .._version import __version__

        return {
            "schema": "shapeguard.check",
            "schema_version": SCHEMA_VERSION,
            "shapeguard_version": __version__,
            "model": self.model,
            "passed": self.passed,
            "verdict": self.verdict,
            "dtype": self.dtype or None,
            "mode": self.mode(),
            "counts": self.counts(),
            "summary": self.summary(),
            "results": [r.to_dict() for r in self.results],
            "findings": [g.to_dict() for g in grouped(self.findings)],
        }

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
