"""Run every shapeguard benchmark, print markdown tables, write docs/benchmarks.md.

    pip install -e ".[bench]"            # torchinfo, for the side-by-side table
    python bench/run.py                  # the full run: about 8-9 minutes on 2 cores
    python bench/run.py --quick          # a smoke run (seconds); writes nothing unless --output
    python bench/run.py --only overhead,scale
    python bench/run.py --clock wall     # wall-clock samples (default: the thread's CPU time)

Every figure is measured in this run, side by side, on one thread (see
`bench/_timing.py`); nothing is copied from an earlier run. The pieces:

- cost          (bench/cost.py)          per-op cost against the floors; every target of issue 16
- overhead      (bench/overhead.py)      guard / trace / check="first" / disabled vs unguarded
- contracts     (bench/contracts.py)     contract-checked forward vs plain vs bare jaxtyping
- meta_scale    (bench/meta_scale.py)    `shapeguard trace --device meta` on an 80-layer stack
- scale         (bench/scale.py)         trace cost at 10, 20, 40, 80 layers: linear?
- check_probe   (bench/check_probe.py)   `shapeguard.check` as a ratio to one forward
- side_by_side  (bench/side_by_side.py)  eight bugs through torch, jaxtyping, torchinfo, shapeguard
- reach         (bench/reach.py)         reach at every attention site vs the trace without it

A piece whose file is not there yet is reported as "not available yet"; a piece
that fails is reported with its error, the others still run, and the exit
status is 1.
"""

import argparse
import datetime
import importlib
import inspect
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from _timing import REPO, Section, Table, Target, fmt_seconds, machine  # noqa: E402

DOC = os.path.join(REPO, "docs", "benchmarks.md")
PIECES = (
    "cost", "overhead", "contracts", "meta_scale", "scale", "check_probe", "side_by_side", "reach",
)  # fmt: skip


# -- adapters: each piece's own entry point, turned into a Section -------------------------
def _accepts(fn, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _call_quick(fn, quick: bool, **extra):
    kwargs = {k: v for k, v in extra.items() if _accepts(fn, k)}
    if _accepts(fn, "quick"):
        kwargs["quick"] = quick
    return fn(**kwargs)


def _as_tables(result, title: str) -> list[Table]:
    """Whatever a piece returned, as tables: a Section, tables, markdown, dicts."""
    if isinstance(result, Section):
        return result.tables
    if isinstance(result, Table):
        return [result]
    if isinstance(result, list | tuple) and result and all(isinstance(r, dict) for r in result):
        headers: list[str] = []
        for row in result:
            headers += [k for k in row if k not in headers]
        rows = [[_cell(row.get(h, "")) for h in headers] for row in result]
        return [Table(title, headers, rows)]
    if isinstance(result, list | tuple):
        return [t for r in result for t in _as_tables(r, title)]
    if isinstance(result, dict):
        return [Table(title, ["figure", "value"], [[k, _cell(v)] for k, v in result.items()])]
    if hasattr(result, "markdown"):
        return [_Text(title, result.markdown())]
    if isinstance(result, str):
        return [_Text(title, result)]
    return [_Text(title, repr(result))]


class _Text(Table):
    """Text a piece printed itself: kept as markdown, or fenced when it is plain text."""

    def __init__(self, title: str, text: str) -> None:
        super().__init__(title, [], [])
        self.text = text.rstrip()

    def markdown(self) -> str:
        if "| ---" in self.text or "|---" in self.text or self.text.lstrip().startswith("#"):
            body = self.text
        else:
            body = f"```\n{self.text}\n```"
        return f"### {self.title}\n\n{body}" if self.title else body


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _gib(n: float) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def _meta_scale(module, quick: bool) -> Section:
    """bench/meta_scale.py: one `shapeguard trace --device meta` run, and the cpu memory.

    Quick mode counts the memory of a 1-layer stack and skips the command's subprocess
    (a fresh interpreter importing torch: most of a smoke run's time)."""
    if quick and hasattr(module, "cpu_memory"):
        result = module.cpu_memory(layers=1)
    else:
        result = module.measure(layers=None)
    limit_s = getattr(module, "TIME_LIMIT_S", 10.0)
    limit_rss = getattr(module, "RSS_LIMIT_BYTES", 1 << 30)
    rows = [["layers", "1 (quick: the command's subprocess run is skipped)" if quick else "80"]]
    if "wall_s" in result:
        rows += [
            ["command", f"`{result.get('command', '').replace(REPO + os.sep, '')}`"],
            ["trace summary", result.get("summary", "")],
            ["wall time", f"{result['wall_s']:.2f} s"],
            ["CPU time", f"{result.get('cpu_s', float('nan')):.2f} s"],
            ["cores the command ran on", str(result.get("cores"))],
            ["peak RSS", f"{result['peak_rss_bytes'] / (1 << 20):,.0f} MiB"],
        ]
    rows += [
        ["memory the same forward needs on cpu", _gib(result.get("total_bytes", 0))],
        ["  of which parameters", _gib(result.get("parameter_bytes", 0))],
        ["  of which activations", _gib(result.get("activation_bytes", 0))],
    ]
    section = Section(
        "Scale: 80-layer Llama-70B-shaped stack on the meta device",
        tables=[
            Table(
                "`shapeguard trace --device meta`"
                + ("" if quick else " (one run in a subprocess, pinned to 2 cores)"),
                ["figure", "value"],
                rows,
            )
        ],
    )
    if not quick:
        section.targets += [
            Target(
                "meta trace of the 80-layer stack: wall time",
                f"< {limit_s:.0f} s",
                f"{result['wall_s']:.2f} s",
                result["wall_s"] < limit_s,
            ),
            Target(
                "meta trace of the 80-layer stack: peak RSS",
                f"< {_gib(limit_rss)}",
                f"{result['peak_rss_bytes'] / (1 << 20):,.0f} MiB",
                result["peak_rss_bytes"] < limit_rss,
            ),
        ]
    return section


def _check_probe(module, quick: bool) -> Section:
    """bench/check_probe.py: `shapeguard.check` as a ratio to one plain forward."""
    result = module.measure(2, 16, 64, repeats=3) if quick else module.measure()
    target = getattr(module, "TARGET", 20.0)
    rounds = 3 if quick else inspect.signature(module.measure).parameters["repeats"].default
    probes = ", ".join(f"{name}: {status}" for name, status in result.get("probes", {}).items())
    ratio = f"{result['ratio']:.1f}x ({result['ratio_q1']:.1f}-{result['ratio_q3']:.1f})"
    table = Table(
        "`shapeguard.check` on the seed MultiHeadAttention vs one plain forward",
        ["size", "plain forward", "shapeguard.check", "ratio (IQR)", "rounds", "probes"],
        [
            [
                result["size"],
                fmt_seconds(result["forward_s"]),
                fmt_seconds(result["check_s"]),
                ratio,
                str(rounds),
                probes,
            ]
        ],
        [
            "The check is one traced forward plus the probes, each a forward of a float64 copy; "
            f"{rounds} interleaved rounds (at B=8, S=512, D=512 a check takes seconds), one thread.",
        ],
    )
    section = Section(TITLES["check_probe"], tables=[table])
    if not quick:
        section.targets.append(
            Target(
                f"shapeguard.check vs one forward, seed MHA, {result['size']}",
                f"< {target:.0f}x",
                f"{result['ratio']:.1f}x",
                result["ratio"] < target,
            )
        )
    measure_decode = getattr(module, "measure_decode", None)
    decode = (
        (measure_decode(steps=4, repeats=1) if quick else measure_decode())
        if measure_decode
        else {}
    )
    if decode:
        limit = getattr(module, "DECODE_TARGET_S", 5.0)
        section.tables.append(
            Table(
                "The decode-consistency probe (prefill, then token by token with the model's cache)",
                ["model", "decode steps", "probe time", "result"],
                [
                    [
                        decode["model"],
                        str(decode["steps"]),
                        fmt_seconds(decode["seconds"]),
                        decode["status"],
                    ]
                ],
                [
                    "One probe run: the prefill and every step with the model's DynamicCache and "
                    "with a StaticCache, compared with one forward, and the first step traced; "
                    "median of 3 runs, one thread.",
                ],
            )
        )
        if not quick:
            section.targets.append(
                Target(
                    f"decode-consistency probe, {decode['model']}, {decode['steps']} steps",
                    f"< {limit:.0f} s",
                    fmt_seconds(decode["seconds"]),
                    decode["seconds"] < limit,
                )
            )
    return section


def _generic(module, name: str, quick: bool) -> Section:
    """A piece with a `run`/`measure`/`main`-style entry point and its own output."""
    for entry in ("run", "bench", "measure", "benchmark", "main"):
        fn = getattr(module, entry, None)
        if callable(fn):
            result = _call_quick(fn, quick)
            if isinstance(result, Section):
                return result
            section = Section(TITLES[name])
            section.tables = _as_tables(result, "")
            targets = getattr(result, "targets", None)
            if isinstance(targets, list):
                section.targets = [t for t in targets if isinstance(t, Target)]
            return section
    raise RuntimeError(f"bench/{name}.py has no run(quick=...) function to call")


TITLES = {
    "cost": "Cost per op against the floors, and the targets of issue 16",
    "overhead": "Overhead",
    "contracts": "Contracts: checked forward vs plain vs bare jaxtyping + beartype",
    "meta_scale": "Scale: 80-layer Llama-70B-shaped stack on the meta device",
    "scale": "Scale: growth with layers (meta device)",
    "check_probe": "shapeguard.check: probes as a ratio to one forward",
    "side_by_side": "Side by side with other shape tools",
    "reach": "Attention reach: its cost per trace (issue 28)",
}


@dataclass
class Outcome:
    name: str
    section: Section
    status: str  # "ok", "missing", "failed"
    seconds: float = 0.0
    error: str = ""


def run_piece(name: str, quick: bool) -> Outcome:
    """Import bench/<name>.py and run it; never raises (a failure is reported)."""
    start = time.perf_counter()
    path = os.path.join(HERE, f"{name}.py")
    if not os.path.exists(path):
        section = Section(TITLES[name], notes=[f"not available yet: `bench/{name}.py` is missing."])
        return Outcome(name, section, "missing")
    try:
        module = importlib.import_module(name)
        if name == "meta_scale" and hasattr(module, "measure"):
            section = _meta_scale(module, quick)
        elif name == "check_probe" and hasattr(module, "measure") and not hasattr(module, "run"):
            section = _check_probe(module, quick)
        else:
            section = _generic(module, name, quick)
    except Exception as error:  # one broken piece must not hide the others' figures
        detail = traceback.format_exc(limit=-3)
        section = Section(
            TITLES[name],
            notes=[f"failed: `{type(error).__name__}: {error}`", f"```\n{detail.rstrip()}\n```"],
        )
        return Outcome(name, section, "failed", time.perf_counter() - start, str(error))
    return Outcome(name, section, "ok", time.perf_counter() - start)


@dataclass
class Report:
    quick: bool
    started: datetime.datetime
    machine: dict
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process and its children, user + system
    clock: str = "thread"

    @property
    def targets(self) -> list[Target]:
        return [t for o in self.outcomes for t in o.section.targets]

    def markdown(self) -> str:
        when = self.started.strftime("%Y-%m-%d %H:%M UTC")
        mode = " --quick" if self.quick else ""
        lines = [
            "# shapeguard benchmarks",
            "",
            f"Written by `python bench/run.py{mode}` on {when}; the run took "
            f"{_duration(self.seconds)} of wall time and {_duration(self.cpu_seconds)} "
            "of CPU time (on an idle machine the two are about equal: one thread "
            "works at a time). Every figure below was measured in that run (ratios side by "
            "side, one thread, median of at least 20 interleaved rounds after warm-up, unless "
            "a table says otherwise). "
            + (
                "Times are the calling thread's CPU time, which other processes on a shared "
                "machine move far less than the wall clock; the meta-device command's wall "
                "time is wall time."
                if self.clock == "thread"
                else "Times are wall-clock time."
            )
            + " Re-run it to refresh this page.",
            "",
        ]
        if self.quick:
            lines += ["**Quick mode: a smoke run with 3 rounds and small sizes; not figures.**", ""]
        machine_table = Table("Machine", ["", ""], [[k, v] for k, v in self.machine.items()])
        lines += [machine_table.markdown(), ""]
        targets = [] if self.quick else self.targets  # quick rounds are too few to judge
        if targets:
            rows = [
                [
                    t.what,
                    t.target,
                    t.measured,
                    "met" if t.met else "**missed**",
                    "" if t.met else t.why,
                ]
                for t in targets
            ]
            headers = ["what", "target", "measured", "", "where the time goes (when missed)"]
            lines += [Table("Targets", headers, rows).markdown(), ""]
        status = [
            [o.name, o.status, f"{o.seconds:.0f} s", o.error[:80]]
            for o in self.outcomes
            if o.status != "ok" or o.seconds
        ]
        lines += [Table("Pieces", ["piece", "status", "time", "error"], status).markdown(), ""]
        for outcome in self.outcomes:
            lines.append(outcome.section.markdown())
        return "\n".join(lines).rstrip() + "\n"


def run_all(quick: bool = False, only: tuple[str, ...] = PIECES, echo=None) -> Report:
    """Run the pieces in order; `echo(text)` gets each section as it finishes."""
    from _timing import one_thread

    one_thread()
    from _timing import clock_name

    report = Report(quick, datetime.datetime.now(datetime.UTC), machine(), clock=clock_name())
    start = time.perf_counter()
    cpu_start = _cpu_seconds()
    for name in only:
        outcome = run_piece(name, quick)
        report.outcomes.append(outcome)
        if echo is not None:
            echo(outcome.section.markdown())
    report.seconds = time.perf_counter() - start
    report.cpu_seconds = _cpu_seconds() - cpu_start
    return report


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} minutes"


def _cpu_seconds() -> float:
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few rounds, small sizes")
    parser.add_argument(
        "--clock",
        choices=("thread", "wall"),
        default="thread",
        help="time samples in the calling thread's CPU time (default) or wall-clock time",
    )
    parser.add_argument(
        "--only",
        default=",".join(PIECES),
        help=f"comma-separated pieces (default: all of {', '.join(PIECES)})",
    )
    parser.add_argument(
        "--output",
        default=None,
        help="where to write the markdown (default: docs/benchmarks.md for a full run, nothing for --quick)",
    )
    options = parser.parse_args(argv)
    only = tuple(p.strip() for p in options.only.split(",") if p.strip())
    unknown = [p for p in only if p not in PIECES]
    if unknown:
        parser.error(f"unknown piece(s) {', '.join(unknown)}; choose from {', '.join(PIECES)}")
    from _timing import use_clock

    use_clock(options.clock)
    report = run_all(options.quick, only, echo=lambda text: print(text, flush=True))
    text = report.markdown()
    print(text[: text.index("\n## ")] if "\n## " in text else text)
    output = options.output or (None if options.quick else DOC)
    if output:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(output)}", file=sys.stderr)
    return 1 if any(o.status == "failed" for o in report.outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
