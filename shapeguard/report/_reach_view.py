"""What the reach renderers share: a site's name, the sites a LAYER names, and the distinct
pictures of a site (one per group of alike examples and heads), each with its rows, its
padding and its flagged cells. Plain data from `trace.reach`; the text and the HTML draw it."""

import fnmatch
import os
from dataclasses import dataclass

from .._errors import Finding
from .._reach.describe import axis_noun, example_axis, indices_text, padded_slices, union
from .._reach.rows import Reach, Runs

# Distinct pictures drawn per site; the others are counted.
MAX_PICTURES = 6


@dataclass(frozen=True)
class Picture:
    """One leading slice of a site as it is drawn, for the slices `label` names."""

    label: str  # "example 1, every head"
    index: tuple[int, ...]  # the slice read (broadcast axes at 0)
    padding: Runs  # its example's padded keys
    marks: dict[int, Runs]  # query -> the keys an invariant flags there


def site_name(trace, reach: Reach) -> str:
    """The module path, else the module's type (the root), else `(top level)`."""
    if reach.module:
        return reach.module
    event = _event(trace, reach.event)
    return (event.module_type if event is not None else "") or "(top level)"


def site_label(trace, reach: Reach) -> str:
    """`#14 softmax in blocks.0.attn (model.py:48)`."""
    at = f"#{reach.event} " if reach.event >= 0 else ""
    where = f" ({os.path.basename(reach.location)})" if reach.location else ""
    return f"{at}{reach.op or 'attention'} in {site_name(trace, reach)}{where}"


def matching(trace, layer: str | None) -> list[Reach]:
    """The sites `layer` names: its module path exactly, else a glob of it, else a
    substring; all sites when `layer` is None or empty."""
    sites = list(trace.reach)
    if not layer:
        return sites
    names = [(site_name(trace, r), r) for r in sites]
    for test in (
        lambda name: name == layer,
        lambda name: fnmatch.fnmatchcase(name, layer),
        lambda name: layer in name,
    ):
        found = [r for name, r in names if test(name)]
        if found:
            return found
    return []


def findings_at(trace, reach: Reach) -> list[tuple[int, Finding]]:
    """(number from 1, finding) of the trace's `reach_*` findings at this site."""
    return [
        (number, f)
        for number, f in enumerate(trace.findings, start=1)
        if f.kind.startswith("reach_") and reach.event >= 0 and f.event_index == reach.event
    ]


def pictures(reach: Reach) -> tuple[list[Picture], int]:
    """The distinct pictures of `reach` (at most `MAX_PICTURES`) and how many more there are.
    Slices whose rows, padding and marks are alike are one picture, labelled with them all."""
    groups: dict[tuple, list[tuple[int, ...]]] = {}
    for index, pad in padded_slices(reach):
        marks = _marks(reach, index)
        rows = tuple(reach.row(index, q) for q in reach.kept_queries)
        groups.setdefault((rows, pad, tuple(sorted(marks.items()))), []).append(index)
    expanded = len(list(reach.slices())) != sum(len(m) for m in groups.values())
    shown = [
        Picture(_label(reach, members, expanded), members[0], pad, dict(marks))
        for (_, pad, marks), members in list(groups.items())[:MAX_PICTURES]
    ]
    return shown, max(0, len(groups) - MAX_PICTURES)


def _marks(reach: Reach, index: tuple[int, ...]) -> dict[int, Runs]:
    """query -> the flagged keys of the slice at `index` (a mark on a broadcast axis is on
    every index along it)."""
    found: dict[int, Runs] = {}
    for where, query, runs in reach.marks:
        if all(s == 1 or w == i for w, i, s in zip(where, index, reach.stored, strict=False)):
            found[query] = union((found.get(query, ()), runs))
    return found


def _label(reach: Reach, members: list[tuple[int, ...]], expanded: bool) -> str:
    """`example 1, every head`, `examples 0, 2, heads 0..3`, or the slices by index."""
    axis = example_axis(reach)
    parts = []
    product = 1
    for a, size in enumerate(reach.lead):
        values = sorted({m[a] for m in members})
        product *= len(values)
        alike = reach.stored[a] == 1 and not (expanded and a == axis)
        if alike or len(values) == size:
            if size > 1:
                parts.append(f"every {axis_noun(reach, a)}")
            continue
        parts.append(indices_text(values, axis_noun(reach, a)))
    if product != len(members):  # not a product of per-axis sets: say the slices
        listed = ", ".join(str(list(m)) for m in members[:4])
        return f"slices {listed}" + (f" and {len(members) - 4} more" if len(members) > 4 else "")
    return ", ".join(parts) or "all queries"


def shown_queries(reach: Reach, limit: int) -> list[int]:
    """The kept queries drawn: all up to `limit`, else `limit` evenly spaced ones with the
    first and the last."""
    kept = list(reach.kept_queries)
    if len(kept) <= limit:
        return kept
    picked = {kept[(i * (len(kept) - 1)) // (limit - 1)] for i in range(limit)}
    return sorted(picked)


def sampling_note(reach: Reach, drawn: int) -> str:
    """ "" when every query is drawn; else how many, of how many kept and of all."""
    kept = len(reach.kept_queries)
    if drawn == reach.seq_q:
        return ""
    kept_text = f"; the trace kept {kept}" if kept != reach.seq_q else ""
    return f"{drawn} of {reach.seq_q} queries drawn (sampled{kept_text})"


def _event(trace, index: int):
    if index < 0:
        return None
    events = trace.events
    if index < len(events) and events[index].index == index:
        return events[index]  # no event dropped before it: its position is its index
    for event in events:
        if event.index == index:
            return event
    return None
