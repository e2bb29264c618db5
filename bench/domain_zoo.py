"""The domain bug zoo (issue 32) through `shapeguard.trace` and `shapeguard.check`.

    python bench/domain_zoo.py                 # the table per domain, at the three sizes
    python bench/domain_zoo.py --json          # the raw rows
    python bench/domain_zoo.py --sizes distinct --only vit,swin

Every bug and every correct counterpart of tests/domain_zoo.py runs at each size setting:
first plainly (does the bug crash torch: "loud"), then through `shapeguard.trace` in warn mode
(its findings, or the error it raises), then through `shapeguard.check` (the API the CLI's check
command calls; its failed probes). A bug is found by the trace at a size when a finding or a
ShapeError points at one of the bug's marked lines; a finding elsewhere in a buggy module is
recorded as a false alarm of its correct part. It is found by trace + check when, besides, a
probe fails that did not fail on the correct counterpart at the same size. For a correct
counterpart any finding or failed probe is a false alarm; the probes that held (passed, not n/a)
are counted. The measuring itself is tests/domain_zoo_measure.py, which the test pins too.
"""

import argparse
import json
import os
import sys
import time

import torch

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
# First, even where it is already on the path: this file's own name is the zoo's, and the zoo
# must win over it (as pytest's prepend import puts tests/ first for tests/test_domain_zoo.py).
if TESTS in sys.path:
    sys.path.remove(TESTS)
sys.path.insert(0, TESTS)

import domain_zoo  # noqa: E402
import domain_zoo_measure as measuring  # noqa: E402


def measure(bug: domain_zoo.Bug | None, arch: domain_zoo.Arch, sizes, correct_failed=()) -> dict:
    """One row: a bug (or, with bug None, the architecture's correct counterpart) at a size.
    A probe that fails on the bug counts only where it did not fail on the correct counterpart
    at the same size (`correct_failed`): a probe that fails on both says nothing of the bug."""
    started = time.perf_counter()
    name = bug.name if bug else None
    row = {"domain": arch.domain, "arch": arch.name, "bug": name, "size": sizes.name}
    row["loud"] = measuring.loud(*measuring.build(arch, sizes, name))
    traced = measuring.run_trace(*measuring.build(arch, sizes, name))
    checked = measuring.run_check(*measuring.build(arch, sizes, name))
    for found in [*traced["findings"], traced["error"]]:
        if found:
            del found["message"]
    row["trace"], row["check"] = traced, checked
    hits = measuring.hits(traced)
    if bug is None:
        row["false_alarms"] = [h["kind"] for h in hits]
        row["outcome"] = "clean" if not hits and not checked["failed"] else "false alarm"
    else:
        about = measuring.about(bug, traced)
        row["found_kinds"] = sorted({h["kind"] for h in about})
        row["false_alarms"] = [f"{h['kind']} at {h['location']}" for h in hits if h not in about]
        row["outcome"] = measuring.outcome(bug, traced, checked, correct_failed)
        row["expected"] = bug.expected(sizes)
    row["seconds"] = round(time.perf_counter() - started, 2)
    return row


def rows(sizes=domain_zoo.SETTINGS, only=None) -> list[dict]:
    out = []
    for s in sizes:
        for arch in domain_zoo.ARCHS.values():
            if only and arch.name not in only:
                continue
            correct = measure(None, arch, s)
            out.append(correct)
            for bug in domain_zoo.BUGS:
                if bug.arch == arch.name:
                    out.append(measure(bug, arch, s, correct["check"]["failed"]))
    return out


def table(all_rows: list[dict]) -> str:
    """Per domain: the bugs, how many crash plain torch at some size (loud), how many the trace
    finds at every size it runs and how many trace + check find, and the same per size; then
    each correct counterpart's findings, failed probes and probes that held; then the misses
    and the findings off a bug's lines."""
    names = [s.name for s in domain_zoo.SETTINGS]
    sizes = sorted({r["size"] for r in all_rows}, key=names.index)
    lines = [
        "| domain | bugs | loud | trace | trace + check | "
        + " | ".join(f"{s}: trace / + check" for s in sizes)
        + " |",
        "| --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in sizes) + " |",
    ]
    for domain in [*domain_zoo.DOMAINS, None]:
        bugs = [r for r in all_rows if r["bug"] and (domain is None or r["domain"] == domain)]
        by_name: dict[str, list[dict]] = {}
        for r in bugs:
            by_name.setdefault(r["bug"], []).append(r)
        if not by_name:
            continue
        n = len(by_name)
        loud = sum(any(r["loud"] for r in rs) for rs in by_name.values())
        trace = sum(all(r["outcome"] == "trace" for r in rs) for rs in by_name.values())
        both = sum(all(r["outcome"] != "miss" for r in rs) for rs in by_name.values())
        cells = []
        for s in sizes:
            at = [r for r in bugs if r["size"] == s]
            t = sum(r["outcome"] == "trace" for r in at)
            b = sum(r["outcome"] != "miss" for r in at)
            cells.append(f"{t} / {b} ({_pct(t, len(at))} / {_pct(b, len(at))})")
        label = domain or "**all**"
        lines.append(
            f"| {label} | {n} | {loud} | {trace} ({_pct(trace, n)}) | {both} ({_pct(both, n)}) | "
            + " | ".join(cells)
            + " |"
        )
    lines += [
        "",
        "| correct | size | findings | failed probes | probes that held |",
        "| --- | --- | --- | --- | ---: |",
    ]
    for r in all_rows:
        if r["bug"] is None:
            lines.append(
                f"| {r['arch']} | {r['size']} | {', '.join(r['false_alarms']) or '-'} | "
                f"{', '.join(r['check']['failed']) or '-'} | {len(r['check']['passed'])} |"
            )
    missed: dict[str, list[str]] = {}
    for r in all_rows:
        if r["bug"] and r["outcome"] == "miss":
            missed.setdefault(r["bug"], []).append(r["size"])
    if missed:
        lines += ["", "missed: " + ", ".join(f"{b} ({', '.join(s)})" for b, s in missed.items())]
    alarms = [r for r in all_rows if r["bug"] and r["false_alarms"]]
    if alarms:
        lines += ["", "findings off the bug's lines in buggy modules:"]
        lines += [f"- {r['bug']} ({r['size']}): {'; '.join(r['false_alarms'])}" for r in alarms]
    return "\n".join(lines)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the raw rows as JSON")
    parser.add_argument("--sizes", default="", help="comma-separated size names (default: all)")
    parser.add_argument("--only", default="", help="comma-separated architecture names")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    chosen = [s for s in domain_zoo.SETTINGS if not args.sizes or s.name in args.sizes.split(",")]
    all_rows = rows(chosen, set(args.only.split(",")) if args.only else None)
    print(json.dumps(all_rows, indent=1) if args.json else table(all_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
