"""A pytest plugin for `cost.suite_cpu`: at the end of the run, the collector's
collections by generation, on one line the benchmark reads back.

CPU time on a noisy machine scatters by more than the suite's 5% target; how often the
collector ran does not (it counts tracked objects made and not yet freed), and its full
collections, each a walk over every object of the process, were a third of the suite's
CPU time where this was written (2026-12). Loaded on both sides of each pair, so it costs both the same (nothing per test).
"""

import gc
import sys

MARK = "shapeguard-bench gc collections:"


def pytest_unconfigure(config) -> None:
    counts = " ".join(str(s["collections"]) for s in gc.get_stats())
    print(f"\n{MARK} {counts}", file=sys.stderr)


def parse(output: str) -> tuple[int, ...] | None:
    """(young, middle, full) from a run's output, or None when the line is not there."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return tuple(int(n) for n in line[len(MARK) :].split())
    return None
