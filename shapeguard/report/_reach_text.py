"""The reach as text: the trace table's line per attention site, and the character matrix
`shapeguard trace --reach [LAYER]` prints (queries as rows, keys as columns)."""

import bisect
import re

from .._reach.describe import describe
from .._reach.rows import Reach, Runs
from ._reach_view import (
    findings_at,
    matching,
    pictures,
    sampling_note,
    shown_queries,
    site_label,
    site_name,
)

# Rows and key columns a matrix draws at most: more queries are sampled, more keys share
# a column (said above the matrix).
MAX_TEXT_ROWS = 48
MAX_TEXT_KEYS = 96
SEEN, HIDDEN, PADDING, FLAGGED, SOME = "#", ".", "p", "!", "+"
LEGEND = (
    f"legend: {SEEN} seen  {HIDDEN} hidden  {PADDING} padding (hidden)  "
    f"{FLAGGED} flagged by a reach_* finding"
)
_LAYER_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


class NoSuchSite(LookupError):
    """LAYER names no attention site of the trace; the message lists the sites."""


# -- the table's lines --------------------------------------------------------------------------
def table_lines(trace, *, fold: bool = False) -> list[str]:
    """`reach #14 softmax in blocks.0.attn (model.py:48): causal`, one per site; with `fold`,
    a site repeating an earlier layer's (same op, line and description) is counted instead."""
    lines, seen, folded = [], set(), 0
    for reach in trace.reach:
        text = describe(reach)
        key = (_LAYER_INDEX.sub("*", reach.module), reach.op, reach.location, text)
        if fold and key in seen and not findings_at(trace, reach):
            folded += 1
            continue
        seen.add(key)
        lines.append(f"reach {site_label(trace, reach)}: {text}")
    dropped = getattr(trace, "reach_dropped", 0)
    if dropped:
        lines.append(
            f"{dropped} more distinct reach{'es' if dropped != 1 else ''} not kept (the trace's bound)"
        )
    if folded:
        alike = "sites not shown: they repeat" if folded != 1 else "site not shown: it repeats"
        lines.append(f"{folded} reach {alike} a site above in another layer (--no-fold shows them)")
    return lines


# -- the matrix ---------------------------------------------------------------------------------
def render_reach(trace, layer: str | None = None) -> str:
    """The reach of the sites `layer` names (a module path, a glob or a substring of one;
    every site when None) as character matrices, one per group of alike examples and heads.
    Raises `NoSuchSite` when `layer` names none."""
    sites = matching(trace, layer)
    if not sites:
        if not trace.reach:
            if layer:
                raise NoSuchSite(f"--reach {layer!r}: the trace recorded no attention site")
            return "no attention site's reach was recorded\n"
        names = ", ".join(dict.fromkeys(site_name(trace, r) for r in trace.reach))
        raise NoSuchSite(f"--reach {layer!r} matches no attention site; the sites: {names}")
    blocks = [site_text(trace, reach) for reach in sites]
    return "\n\n".join(blocks) + f"\n\n{LEGEND}\n"


def site_text(trace, reach: Reach) -> str:
    """One site: its label and shape, its description, its findings, its matrices."""
    lead = ", ".join(
        f"{name}={size}" if name else str(size)
        for name, size in zip(reach.lead_axes or ("",) * len(reach.lead), reach.lead, strict=False)
    )
    shape = f"[{lead + ', ' if lead else ''}seq_q={reach.seq_q}, seq_k={reach.seq_k}]"
    lines = [f"{site_label(trace, reach)} {shape}, read from: {reach.how}", f"  {describe(reach)}"]
    lines += [f"  {f.severity} {f.kind}: {f.headline}" for _, f in findings_at(trace, reach)]
    drawn, more = pictures(reach) if reach.seq_q and reach.seq_k else ([], 0)
    for picture in drawn:
        lines.append(f"  {picture.label}:")
        lines += [
            "    " + line for line in matrix(reach, picture.index, picture.padding, picture.marks)
        ]
    if more:
        lines.append(f"  {more} more distinct slices not drawn (--json writes their rows)")
    return "\n".join(lines)


def matrix(
    reach: Reach, index: tuple[int, ...], padding: Runs, marks: dict[int, Runs]
) -> list[str]:
    """The lines of one slice's matrix: a note when sampled, the key ruler, one row per
    drawn query (`q 5 ##....`)."""
    queries = shown_queries(reach, MAX_TEXT_ROWS)
    per = -(-reach.seq_k // MAX_TEXT_KEYS)  # keys per column
    columns = [(a, min(a + per, reach.seq_k)) for a in range(0, reach.seq_k, per)]
    label = len(f"q {reach.seq_q - 1}")
    lines = []
    note = sampling_note(reach, len(queries))
    if note:
        lines.append(note)
    if per > 1:
        lines.append(f"keys 0..{reach.seq_k - 1}, {per} to a column ({SOME} some of them seen)")
    else:
        if reach.seq_k > 10:
            lines.append(
                " " * (label + 1)
                + "".join(str(k // 10 % 10) if k % 10 == 0 else " " for k in range(reach.seq_k))
            )
        lines.append(" " * (label + 1) + "".join(str(k % 10) for k in range(reach.seq_k)))
    for q in queries:
        row = reach.row(index, q)
        cells = "".join(_cell(row, padding, marks.get(q, ()), a, b) for a, b in columns)
        lines.append(f"{f'q {q}':>{label}} {cells}")
    return lines


def _cell(row: Runs, padding: Runs, flagged: Runs, a: int, b: int) -> str:
    """The character of keys a..b-1 for one query."""
    if _overlap(flagged, a, b):
        return FLAGGED
    seen = _overlap(row, a, b)
    if seen == b - a:
        return SEEN
    if seen:
        return SOME
    return PADDING if _overlap(padding, a, b) == b - a else HIDDEN


def _overlap(runs: Runs, a: int, b: int) -> int:
    """How many of keys a..b-1 the sorted, disjoint `runs` hold (found by bisection: a row
    of a scattered mask may hold thousands of runs)."""
    total = 0
    for c, d in runs[bisect.bisect_right(runs, a, key=lambda run: run[1]) :]:
        if c >= b:
            break
        total += min(b, d) - max(a, c)
    return total
