"""Shared benchmark helpers: side-by-side timing, markdown tables, machine details.

Every timed figure in `bench/` comes from `compare`: the variants run in one
process on one thread, interleaved round by round (in a new shuffled order each
round, so drift and position effects fall on every variant alike), and each variant's
time is the median of at least 20 rounds after warm-up. Ratios are the median
of the per-round ratios to the baseline of the same round, so a slow stretch of
a shared machine hits the numerator and the denominator together. Samples are
the calling thread's CPU time unless `use_clock("wall")` says otherwise.
"""

import contextlib
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MIN_REPEATS = 20


def one_thread() -> None:
    """Pin torch to one thread, as every figure here is measured."""
    import torch

    torch.set_num_threads(1)


@dataclass
class Variant:
    """One way to run the same work: `fn()` is timed, inside `context()` when given."""

    name: str
    fn: Callable[[], object]
    context: Callable[[], contextlib.AbstractContextManager] | None = None


@dataclass
class Timing:
    """A variant's median time per call and its ratio to the baseline (paired, per round)."""

    name: str
    seconds: float  # median seconds per call
    ratio: float  # median of per-round ratios to the baseline
    ratio_q1: float  # 25th percentile of the per-round ratios
    ratio_q3: float  # 75th percentile
    samples: list[float] = field(repr=False, default_factory=list)

    def ratio_text(self) -> str:
        return f"{self.ratio:.2f}x"

    def spread_text(self) -> str:
        return f"{self.ratio_q1:.2f}-{self.ratio_q3:.2f}"


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


# The clock of every sample: the calling thread's CPU time by default. With one torch
# thread the whole forward runs in the calling thread, so this is the forward's time
# on an idle machine, and other processes on a shared one move it far less than
# they move the wall clock (while the process waits for a core, no CPU time passes).
CLOCKS = {"thread": time.thread_time, "wall": time.perf_counter}
_clock = {"name": "thread"}


def use_clock(name: str) -> None:
    """Time every later sample with `name`: "thread" (CPU time, the default) or "wall"."""
    if name not in CLOCKS:
        raise ValueError(f"clock {name!r} is not one of {', '.join(CLOCKS)}")
    _clock["name"] = name


def clock_name() -> str:
    return _clock["name"]


def _run(variant: Variant, inner: int) -> float:
    context = variant.context() if variant.context is not None else contextlib.nullcontext()
    fn = variant.fn
    clock = CLOCKS[_clock["name"]]
    with context:
        start = clock()
        for _ in range(inner):
            fn()
        return (clock() - start) / inner


def compare(
    variants: list[Variant],
    *,
    repeats: int = MIN_REPEATS,
    warmup: int = 2,
    min_sample_s: float = 0.02,
) -> dict[str, Timing]:
    """Time `variants` side by side; the first one is the baseline of every ratio.

    Each variant first runs `warmup` times (caches, lazy imports, check="first"'s
    first call); then it is timed in `repeats` rounds. A fast call is repeated
    inside one sample until the sample lasts `min_sample_s`, so timer resolution
    never matters. Returns the timings by name, in the order given.
    """
    if len(variants) < 1:
        raise ValueError("compare needs at least one variant")
    inner: dict[str, int] = {}
    for variant in variants:
        last = 0.0
        for _ in range(max(1, warmup)):
            last = _run(variant, 1)
        inner[variant.name] = max(1, math.ceil(min_sample_s / max(last, 1e-9)))
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    # A fresh order each round, seeded so runs are repeatable. Not a rotation: a rotation
    # keeps neighbors together, and a variant that always follows the same call finds
    # that call's data still in cache.
    shuffle = random.Random(0).shuffle
    for _ in range(repeats):
        order = list(variants)
        shuffle(order)
        for variant in order:
            samples[variant.name].append(_run(variant, inner[variant.name]))
    base = samples[variants[0].name]
    timings: dict[str, Timing] = {}
    for variant in variants:
        mine = samples[variant.name]
        ratios = [m / b for m, b in zip(mine, base, strict=True)]
        q1, q3 = _quartiles(ratios)
        timings[variant.name] = Timing(
            variant.name, statistics.median(mine), statistics.median(ratios), q1, q3, mine
        )
    return timings


def paired_ratio(mine: Timing, base: Timing) -> float:
    """Median of the per-round ratios of two variants timed in the same `compare` call."""
    return statistics.median(m / b for m, b in zip(mine.samples, base.samples, strict=True))


@contextlib.contextmanager
def environ(name: str, value: str):
    """Set one environment variable for the duration of the block."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def fmt_seconds(seconds: float) -> str:
    """Seconds in the unit that reads best: 83 us, 4.2 ms, 1.31 s (a sign when negative)."""
    size = abs(seconds)
    if size < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if size < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


@dataclass
class Table:
    """A markdown table with a title and notes under it."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""] if self.title else []
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join(" --- " for _ in self.headers) + "|")
        for row in self.rows:
            if len(row) != len(self.headers):
                raise ValueError(f"row {row!r} has {len(row)} cells for {len(self.headers)}")
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        return "\n".join(lines)


@dataclass
class Target:
    """One target of the issue and whether this run met it."""

    what: str
    target: str
    measured: str
    met: bool
    why: str = ""


@dataclass
class Section:
    """What one benchmark piece reports: tables, targets, and notes."""

    title: str
    tables: list[Table] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        parts = [f"## {self.title}", ""]
        parts.extend(note + "\n" for note in self.notes)
        parts.extend(t.markdown() + "\n" for t in self.tables)
        return "\n".join(parts).rstrip() + "\n"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    """The machine and the versions the figures were measured with."""
    import torch

    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "n/a"
    return {
        "CPU": cpu_model(),
        "cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "load average (1, 5, 15 min) at start": load,
        "OS": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "jaxtyping": _version("jaxtyping"),
        "beartype": _version("beartype"),
        "torchinfo": _version("torchinfo"),
        "shapeguard": _version("shapeguard-attn"),
    }


def load_file(relpath: str, name: str):
    """Import a file of this repository (an example, a bench model) as module `name`."""
    import importlib.util

    path = os.path.join(REPO, relpath)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
