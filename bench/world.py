"""The world corpus: shapeguard on correct attention code nobody here wrote.

Every transformers architecture that builds from a tiny config, plus the attention models of
other packages users run, through warn- and raise-mode traces, guard, generate and check, at
three size settings with no, right and left padding. Prints crashes, findings, non-identical
outputs, raise-mode raises, generate mismatches, check failures and inconclusive probes, and
one summary line last; exit status 1 when a count that must be 0 is not. docs/world.md says
what each count means and holds the results of the last full run.

    python bench/world.py                        # everything (20-40 min on 2 shared cores)
    python bench/world.py --quick                # a fixed sample of about 60 architectures
    python bench/world.py --only xglm,wavlm,x-transformers
    python bench/world.py --discover             # build and run plainly only
    python bench/world.py --json world.json --write-docs
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def _tasks(args):
    from _world_candidates import candidates
    from _world_packages import PACKAGES
    from _world_sizes import QUICK

    types = [c.model_type for c in candidates()[0]]
    packages = list(PACKAGES)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in types and n not in packages]
        if unknown:
            raise SystemExit(f"world: unknown architecture or package: {', '.join(unknown)}")
        types = [t for t in types if t in wanted]
        packages = [p for p in packages if p in wanted]
    elif args.quick:
        types = [t for t in types if t in QUICK]
    if args.no_packages:
        packages = []
    return [("transformers", t, args.discover) for t in types] + [
        ("package", p, args.discover) for p in packages
    ]


def versions(results) -> dict:
    import numpy
    import torch
    import transformers

    import shapeguard

    out = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "shapeguard": shapeguard.__version__,
    }
    for r in results:
        for name, version in r.get("versions", {}).items():
            out[name] = version
    return out


def _git(*args) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def _commit() -> str:
    """The commit, and how many files under shapeguard/ differed from it (others' work in
    progress in a shared checkout runs too)."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [
        line for line in _git("status", "--porcelain", "--", "shapeguard").splitlines() if line
    ]
    return commit + (f" + {len(dirty)} uncommitted files under shapeguard/" if dirty else "")


def _load(paths):
    """Saved runs, merged: a later file's result replaces an earlier one of the same name
    (a rerun of the subjects that ran past their timeout, say)."""
    by_name, meta = {}, None
    for path in paths:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        by_name.update({r["name"]: r for r in saved["results"]})
        if meta is None:
            meta = saved["meta"]
        else:
            names = ",".join(r["name"] for r in saved["results"])
            meta["command"] += f"\n{saved['meta']['command']}  # rerun of {names}, results merged"
            meta["wall_s"] += saved["meta"]["wall_s"]
    return sorted(by_name.values(), key=lambda r: (r["source"] != "transformers", r["name"])), meta


def _progress(result):
    status = result.get("status")
    seconds = result.get("seconds", "")
    print(f"  {result['name']}: {status} {seconds}s", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types and package names")
    parser.add_argument(
        "--quick", action="store_true", help="the fixed sample of about 60 architectures"
    )
    parser.add_argument("--discover", action="store_true", help="build and run plainly only")
    parser.add_argument("--no-packages", action="store_true", help="transformers only")
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes side by side (default 1)"
    )
    parser.add_argument(
        "--timeout", type=int, default=300, help="seconds per subject (default 300)"
    )
    parser.add_argument("--json", help="write every result to this file")
    parser.add_argument(
        "--write-docs", action="store_true", help="regenerate the results of docs/world.md"
    )
    parser.add_argument(
        "--from-json",
        help="report (and --write-docs) from earlier --json files, comma-separated, merged",
    )
    parser.add_argument("--worker-log", default=os.devnull, help="workers' stdout and stderr")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="one progress line per subject"
    )
    args = parser.parse_args(argv)

    import _world_pool
    import _world_report

    if args.from_json:
        results, meta = _load(args.from_json.split(","))
    else:
        start = time.perf_counter()
        results = _world_pool.run_all(
            _tasks(args),
            jobs=args.jobs,
            timeout=args.timeout,
            log_path=args.worker_log,
            on_result=_progress if args.verbose else None,
        )
        meta = {
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _commit(),
            "command": "python bench/world.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "wall_s": round(time.perf_counter() - start, 1),
            "versions": versions(results),
        }
    tallied = _world_report.tally(results)
    lines = _world_report.lines(tallied, results)
    if args.json and not args.from_json:
        with open(args.json, "w", encoding="utf-8") as f:
            saved = {"meta": meta, "counts": tallied["counts"], "results": results}
            json.dump(saved, f, indent=1, default=str)
    if args.write_docs:
        import _world_docs

        _world_docs.write(os.path.join(ROOT, "docs", "world.md"), meta, tallied, results)
    print("\n".join(lines))
    return 1 if _world_report.failed(tallied["counts"]) else 0


if __name__ == "__main__":
    sys.exit(main())
