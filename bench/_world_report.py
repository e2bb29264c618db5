"""Counting and printing the world corpus's results.

Every count but `inconclusive` must be 0 on correct code (the models and packages are taken
as correct: a finding is a false alarm until shown to be a real bug of the model):

- crashes: configurations (and generate runs) where shapeguard raised an exception that is
  not a ShapeError while the plain forward ran, plus subjects whose worker died (a subject
  past its timeout is listed apart: slow is not a crash, and its time says which);
- findings: configurations (and generate runs) with at least one finding in warn mode;
- non-identical: configurations whose outputs under a trace or guard (or after `check`)
  are not bit-identical to the plain forward's;
- raise-mode raises: configurations (and generate runs) where the raise-mode trace or the
  guard raised a ShapeError;
- generate mismatches: decoders whose generated tokens differ plain / traced / guarded;
- check failures: subjects whose `check` had a failed probe or raised;
- inconclusive: probe results that neither passed nor failed nor were not applicable.
"""

from collections import Counter

MUST_BE_ZERO = (
    "crashes",
    "findings",
    "non-identical",
    "raise-mode raises",
    "generate mismatches",
    "check failures",
)


def _configs(result):
    return {t: c for t, c in result.get("configs", {}).items() if "findings" in c or "crash" in c}


def tally(results) -> dict:
    """The counts of the summary line, and the details behind each."""
    ran = [r for r in results if r.get("status") == "ok"]
    arch = [r for r in ran if r["source"] == "transformers"]
    packages = sorted({r.get("package", r["name"]) for r in ran if r["source"] != "transformers"})
    t: dict = {"architectures": len(arch), "packages": len(packages), "configs": 0}
    details: dict = {k: [] for k in (*MUST_BE_ZERO, "inconclusive", "not built", "n/a", "timeouts")}
    inconclusive = 0
    for r in results:
        name = r["name"]
        if r.get("status") in ("died", "runner error"):
            details["crashes"].append((name, r["status"], r.get("error", "")))
            continue
        if r.get("status") == "timeout":
            # Slow, not necessarily hung: listed apart (see the subject's plain forward time).
            details["timeouts"].append((name, r["status"], r.get("error", "")))
            continue
        if r.get("status") != "ok":
            details["not built"].append((name, r.get("status", "?"), r.get("error", "")))
            continue
        for tag, c in _configs(r).items():
            t["configs"] += 1
            if "crash" in c:
                details["crashes"].append((name, tag, _crash(c["crash"])))
            if c.get("findings"):
                details["findings"].append((name, tag, c["findings"]))
            diffs = c.get("differences", []) + c.get("guard_differences", [])
            if diffs:
                details["non-identical"].append((name, tag, diffs[:3]))
            for key in ("raise", "guard_raise"):
                if c.get(key):
                    details["raise-mode raises"].append((name, f"{tag} {key}", c[key]))
        g = r.get("generate")
        if g and "plain_error" not in g:
            if "crash" in g:
                details["crashes"].append((name, "generate", _crash(g["crash"])))
            if g.get("findings"):
                details["findings"].append((name, "generate", g["findings"]))
            if g.get("guard_raise"):
                details["raise-mode raises"].append((name, "generate guard", g["guard_raise"]))
            if g.get("trace_same") is False or g.get("guard_same") is False:
                details["generate mismatches"].append((name, "generate", g))
        c = r.get("check")
        if c:
            if c.get("differences_after"):
                details["non-identical"].append((name, "after check", c["differences_after"][:3]))
            failed = [p for p in c.get("probes", []) if p["outcome"] == "failed"]
            if "crash" in c:
                details["check failures"].append((name, "check raised", _crash(c["crash"])))
            elif failed:
                shown = [_with_finding(p, c.get("findings", [])) for p in failed]
                details["check failures"].append((name, "check", shown))
            for p in c.get("probes", []):
                if p["outcome"] == "inconclusive":
                    inconclusive += 1
                    details["inconclusive"].append((name, p["name"], p["message"]))
                elif p["outcome"] == "n/a":
                    details["n/a"].append((name, p["name"], p["message"]))
    for key in MUST_BE_ZERO:
        t[key] = len(details[key])
    t["inconclusive"] = inconclusive
    t["not built"] = len(details["not built"])
    t["packages_names"] = packages
    return {"counts": t, "details": details}


def _crash(crash) -> str:
    where = crash.get("where", "")
    return f"{crash.get('mode', '')} {crash['error']}" + (f" at {where}" if where else "")


def summary_line(counts) -> str:
    c = counts
    return (
        f"world: architectures {c['architectures']}, packages {c['packages']}, configs {c['configs']}, "
        f"crashes {c['crashes']}, findings {c['findings']}, non-identical {c['non-identical']}, "
        f"raise-mode raises {c['raise-mode raises']}, generate mismatches {c['generate mismatches']}, "
        f"check failures {c['check failures']}, inconclusive {c['inconclusive']}"
    )


def _with_finding(probe: dict, findings: list) -> dict:
    """A failed shape-checks probe with its first finding's relation: the count alone
    ("2 finding(s) (batch_mixing):") says nothing of what was found."""
    if probe["name"].split(": ")[-1] != "shape checks" or not findings:
        return probe
    first = _first_line(findings[0].get("message", ""), width=10_000)
    return {**probe, "message": f"{_first_line(probe['message'])} {first}"}


def _first_line(text, width=220):
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _by_subject(entries):
    grouped: dict = {}
    for name, where, what in entries:
        grouped.setdefault(name, []).append((where, what))
    return grouped


def non_text_blocks(results) -> list:
    """One row per non-text block of a package (an image, audio, graph, protein or feature
    model): its configurations with a finding, its failed probes, and the probes of its
    `check` that held (passed; n/a is not holding). Issue 32 asks for one probe besides the
    shape checks that holds on every such block."""
    rows = []
    for r in results:
        for label, modality in r.get("modalities", {}).items():
            if modality == "text" or r.get("status") != "ok":
                continue
            configs = [c for c in _configs(r).values() if c.get("model") == label]
            probes = [
                p for p in (r.get("check") or {}).get("probes", [])
                if p["name"].rpartition(": ")[0] == label
            ]  # fmt: skip
            held = [p["name"].rpartition(": ")[2] for p in probes if p["outcome"] == "passed"]
            rows.append({
                "package": r["name"], "block": label, "modality": modality,
                "configs": len(configs), "findings": sum(bool(c.get("findings")) for c in configs),
                "failed": sum(p["outcome"] == "failed" for p in probes),
                "inconclusive": sum(p["outcome"] == "inconclusive" for p in probes),
                "n/a": sum(p["outcome"] == "n/a" for p in probes), "held": held,
            })  # fmt: skip
    return rows


def held_beyond_shape_checks(row) -> list:
    return [name for name in row["held"] if name != "shape checks"]


def _block_line(row) -> str:
    beyond = held_beyond_shape_checks(row)
    return (
        f"NON-TEXT {row['package']}: {row['block']} ({row['modality']}): held {len(row['held'])} "
        f"({len(beyond)} besides shape checks: {', '.join(beyond) or 'none'}), findings "
        f"{row['findings']} of {row['configs']} configs, failed {row['failed']}, inconclusive "
        f"{row['inconclusive']}, n/a {row['n/a']}"
    )


def lines(tallied, results=()) -> list:
    """The printed report: each count's details, then the summary line last."""
    details, counts = tallied["details"], tallied["counts"]
    out = []
    for name, entries in _by_subject(details["crashes"]).items():
        out.append(
            f"CRASH {name}: {len(entries)} ({', '.join(w for w, _ in entries[:6])}) {_first_line(entries[0][1])}"
        )
    for name, entries in _by_subject(details["findings"]).items():
        kinds: Counter = Counter()
        first = {}
        for _, found in entries:
            for f in found:
                kinds[f["kind"]] += f["count"]
                first.setdefault(f["kind"], f["message"])
        for kind, n in sorted(kinds.items()):
            out.append(
                f"FINDING {name}: {kind} x{n} in {len(entries)} configs: {_first_line(first[kind])}"
            )
    for name, entries in _by_subject(details["non-identical"]).items():
        out.append(
            f"NON-IDENTICAL {name}: {entries[0][0]}: {_first_line('; '.join(entries[0][1]))}"
        )
    for name, entries in _by_subject(details["raise-mode raises"]).items():
        out.append(
            f"RAISE {name}: {len(entries)} ({', '.join(w for w, _ in entries[:4])}): {_first_line(entries[0][1])}"
        )
    for name, entries in _by_subject(details["generate mismatches"]).items():
        out.append(f"GENERATE MISMATCH {name}: {entries[0][1]}")
    for name, where, what in details["check failures"]:
        if isinstance(what, list):
            for p in what:
                out.append(f"CHECK FAILED {name}: {p['name']}: {_first_line(p['message'])}")
        else:
            out.append(f"CHECK FAILED {name}: {where}: {_first_line(what)}")
    for name, probe, message in details["inconclusive"]:
        out.append(f"INCONCLUSIVE {name}: {probe}: {_first_line(message)}")
    for name, _status, error in details["timeouts"]:
        out.append(f"TIMEOUT {name}: {error}")
    for name, _status, error in details["not built"]:
        out.append(f"NOT BUILT {name}: {_first_line(error, 160)}")
    out += [_block_line(row) for row in non_text_blocks(results)]
    out.append(summary_line(counts))
    return out


def failed(counts) -> bool:
    return any(counts[k] for k in MUST_BE_ZERO)
