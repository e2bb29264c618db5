"""One report from the JSON reports of several ranks (`shapeguard merge`, `trace --tp`).

Findings are grouped by what they are and where (kind, severity, op, module, file:line),
each group naming the ranks that hit it; where the ranks' messages differ (an uneven
split gives rank 2 other sizes than rank 0), each rank's relation and operands are
shown. Ops whose shapes differ between ranks are listed side by side. Pure Python.
"""

import json
from dataclasses import dataclass, field


class MergeError(Exception):
    """A report file that cannot be read or is not a shapeguard trace."""


@dataclass
class Group:
    kind: str
    severity: str
    where: str  # `module at file:line`
    ranks: list[int] = field(default_factory=list)
    by_rank: dict[int, dict] = field(default_factory=dict)


@dataclass
class Merged:
    world_size: int | None
    ranks: list[int]  # the ranks reported (simulated ones stand for their look-alikes)
    groups: list[Group]
    differing: list[tuple[int, str, str, dict[int, str]]]  # index, op, location, shapes
    simulated: bool = False

    @property
    def errors(self) -> int:
        return sum(1 for g in self.groups if g.severity == "error")

    @property
    def warnings(self) -> int:
        return sum(1 for g in self.groups if g.severity != "error")


def load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as error:
        raise MergeError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise MergeError(f"{path} is not JSON: {error}") from None
    if not isinstance(data, dict) or data.get("schema") != "shapeguard.trace":
        raise MergeError(f"{path} is not a shapeguard trace report (--json)")
    return data


def rank_of(report: dict, default: int) -> int:
    info = report.get("distributed") or {}
    rank = info.get("rank")
    return rank if isinstance(rank, int) else default


def merge(reports: dict[int, dict], also: dict[int, list[int]] | None = None) -> Merged:
    """`reports`: rank -> its report. `also`: rank -> the other ranks it stands for (a
    simulated rank whose shards have the same sizes as theirs)."""
    also = also or {}
    groups: dict[tuple, Group] = {}
    world = None
    simulated = False
    for rank in sorted(reports):
        report = reports[rank]
        info = report.get("distributed") or {}
        world = info.get("world_size", world)
        simulated = simulated or bool(info.get("simulated"))
        seen: set[tuple] = set()
        for f in report.get("findings", []):
            where = _where(f)
            key = (f.get("kind"), f.get("severity"), f.get("op"), where)
            if key in seen:
                continue
            seen.add(key)
            group = groups.get(key)
            if group is None:
                group = groups[key] = Group(f.get("kind", "?"), f.get("severity", "error"), where)
            for r in (rank, *also.get(rank, ())):
                group.ranks.append(r)
                group.by_rank[r] = f
    every = sorted({r for rank in reports for r in (rank, *also.get(rank, ()))})
    for group in groups.values():
        group.ranks.sort()
    return Merged(world, every, list(groups.values()), _differing(reports), simulated)


def _where(f: dict) -> str:
    module, location = f.get("module") or "", f.get("location") or ""
    if module and location:
        return f"{module} at {location}"
    return module or location or "(no location)"


def _shape_text(t: dict) -> str:
    local = t.get("local_shape")
    shape = local if local is not None else t.get("shape", [])
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _differing(reports: dict[int, dict], limit: int = 20) -> list:
    """Events at the same index, of the same op and line, whose output shapes (this rank's
    shard for a DTensor) differ between ranks."""
    ranks = sorted(reports)
    if len(ranks) < 2:
        return []
    events = {r: reports[r].get("events", []) for r in ranks}
    rows = []
    for i in range(min(len(e) for e in events.values())):
        first = events[ranks[0]][i]
        key = (first.get("op"), first.get("location"))
        if any((events[r][i].get("op"), events[r][i].get("location")) != key for r in ranks):
            break  # the ranks ran different code from here on
        shapes = {
            r: " ".join(_shape_text(t) for t in events[r][i].get("outputs", [])) for r in ranks
        }
        if len(set(shapes.values())) > 1:
            rows.append((first.get("index", i), key[0] or "?", key[1] or "", shapes))
            if len(rows) >= limit:
                break
    return rows


def ranks_text(ranks: list[int], world: int | None) -> str:
    if world and ranks == list(range(world)) and world > 1:
        return f"all {world} ranks"
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs, start = [], ranks[0]
    for i, a in enumerate(ranks):
        if i + 1 == len(ranks) or ranks[i + 1] != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            if i + 1 < len(ranks):
                start = ranks[i + 1]
    return "ranks " + ", ".join(runs)


def render(merged: Merged, sources: tuple[str, ...] | list[str] = ()) -> str:
    world = merged.world_size
    lines = []
    head = f"shapeguard merge: {len(merged.ranks)} rank{'s' if len(merged.ranks) != 1 else ''}"
    if world is not None:
        head += f" of {world}"
    if merged.simulated:
        head += " (simulated on torch's fake process group)"
    if sources:
        head += f", from {', '.join(sources)}"
    lines.append(head)
    if world is not None and len(merged.ranks) < world:
        missing = sorted(set(range(world)) - set(merged.ranks))
        lines.append(f"note: no report from {ranks_text(missing, None)}")
    lines.append("")
    for group in merged.groups:
        lines.append(
            f"{group.severity} {group.kind} on {ranks_text(group.ranks, world)}: {group.where}"
        )
        first = group.by_rank[group.ranks[0]]
        lines.extend("  " + line for line in (first.get("message") or "").splitlines())
        shown = {first.get("message")}
        for r in group.ranks[1:]:
            f = group.by_rank[r]
            if f.get("message") in shown:
                continue
            shown.add(f.get("message"))
            lines.append(f"  on rank {r}: {f.get('relation') or f.get('message', '')}")
            for o in f.get("operands", []):
                lines.append(f"    {o.get('name', '')}  {o.get('shape', '')}")
        lines.append("")
    if merged.differing:
        ranks = sorted(merged.differing[0][3])
        lines.append("shapes that differ between ranks (this rank's shard of a DTensor):")
        for index, op, location, shapes in merged.differing:
            side = " | ".join(f"rank {r} {shapes[r]}" for r in ranks)
            lines.append(f"  #{index} {op} at {location}: {side}")
        lines.append("")
    clean = sorted(set(merged.ranks) - {r for g in merged.groups for r in g.ranks})
    if merged.groups and clean:
        lines.append(f"no finding on {ranks_text(clean, None)}")
    lines.append(
        f"{merged.errors} error{'s' if merged.errors != 1 else ''}, "
        f"{merged.warnings} warning{'s' if merged.warnings != 1 else ''} "
        f"across {ranks_text(merged.ranks, world)}"
    )
    return "\n".join(lines) + "\n"
