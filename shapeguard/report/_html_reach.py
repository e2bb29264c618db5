"""The HTML report's attention reach: per site, its description, its `reach_*` findings and
one small inline SVG matrix per group of alike examples and heads (queries as rows, keys as
columns), padding and flagged cells marked. Drawn from runs, so a long sequence is as cheap
as a short one; past `MAX_SVG_ROWS` queries the rows are sampled, and the picture says so."""

import math

from .._reach.describe import bounded_runs_text, describe
from .._reach.rows import Reach
from ._html_page import escaped
from ._reach_view import Picture, findings_at, pictures, sampling_note, shown_queries, site_label

MAX_SVG_ROWS = 64
# The matrix's size in pixels at most (cells shrink to fit, and grow to at most CELL).
WIDTH, HEIGHT, CELL = 360, 360, 14
MARGIN = 34  # room for the query labels on the left and the key labels above

REACH_CSS = """
.reach-site { margin:0 0 22px; } .reach-site h3 { font-size:14px; margin:0 0 2px; }
.reach-site .describe { margin:0 0 6px; font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace; }
.reach-site ul.reach-findings { list-style:none; padding-left:0; margin:0 0 6px; }
.reach-site .pictures { display:flex; flex-wrap:wrap; gap:14px; }
.reach-site figure { margin:0; font-size:12px; color:var(--muted); }
svg.reach rect.hidden { fill:#eef0f4; } svg.reach rect.seen { fill:#3451b2; }
svg.reach rect.pad { fill:#f6d7a7; } svg.reach rect.flag { fill:#c62828; }
svg.reach line.grid { stroke:#fff; stroke-width:1; }
svg.reach text { font-size:10px; fill:var(--muted); font-family:ui-monospace,monospace; }
.swatch { display:inline-block; width:10px; height:10px; vertical-align:middle; margin:0 3px 0 10px; }
"""


def reach_section(trace, sites: list[Reach] | None = None) -> str:
    """Every site's reach (or those of `sites`), with a legend; a note where none was
    recorded."""
    sites = trace.reach if sites is None else sites
    if not sites:
        return '<p class="note">No attention site\'s reach was recorded.</p>'
    legend = (
        '<p class="note">Which keys each query can see, read from the values that reach the '
        "softmax or the kernel. Row i is query i, column j is key j."
        '<span class="swatch" style="background:#3451b2"></span>seen'
        '<span class="swatch" style="background:#eef0f4"></span>hidden'
        '<span class="swatch" style="background:#f6d7a7"></span>padding'
        '<span class="swatch" style="background:#c62828"></span>flagged by a finding</p>'
    )
    return legend + "".join(_site(trace, n, reach) for n, reach in enumerate(sites))


def _site(trace, number: int, reach: Reach) -> str:
    findings = "".join(
        f'<li class="finding {escaped(f.severity)}"><a href="#finding-{n}">#{n}</a> '
        f"<code>{escaped(f.kind)}</code> {escaped(f.headline)}</li>"
        for n, f in findings_at(trace, reach)
    )
    drawn, more = pictures(reach) if reach.seq_q and reach.seq_k else ([], 0)
    figures = "".join(_figure(reach, p) for p in drawn)
    tail = f'<p class="note">{more} more distinct slices not drawn.</p>' if more else ""
    return (
        f'<div class="reach-site" id="reach-{number}" data-event="{reach.event}">'
        f"<h3>{escaped(site_label(trace, reach))}</h3>"
        f'<p class="describe">{escaped(describe(reach))}</p>'
        + (f'<ul class="reach-findings">{findings}</ul>' if findings else "")
        + f'<div class="pictures">{figures}</div>{tail}</div>'
    )


def _figure(reach: Reach, picture: Picture) -> str:
    queries = shown_queries(reach, MAX_SVG_ROWS)
    note = sampling_note(reach, len(queries))
    caption = escaped(picture.label) + (f"<br>{escaped(note)}" if note else "")
    return (
        f"<figure>{svg_matrix(reach, picture, queries)}<figcaption>{caption}</figcaption></figure>"
    )


def svg_matrix(
    reach: Reach, picture: Picture, queries: list[int], words: tuple[str, str] = ("query", "key")
) -> str:
    """One slice as an SVG: a hidden background, padding columns, the seen runs of each
    drawn query (its runs as the row's tooltip), the flagged keys on top. `words` name the
    rows and columns: ("output", "input") for the reach `check` measures."""
    row_word, column_word = words
    cw = min(CELL, WIDTH / max(reach.seq_k, 1))
    ch = min(CELL, HEIGHT / max(len(queries), 1))
    width, height = reach.seq_k * cw, len(queries) * ch
    parts = [
        f'<rect class="hidden" x="{MARGIN}" y="{MARGIN}" width="{_n(width)}" height="{_n(height)}"/>'
    ]
    parts += [
        f'<rect class="pad" x="{_n(MARGIN + a * cw)}" y="{MARGIN}" width="{_n((b - a) * cw)}" '
        f'height="{_n(height)}"/>'
        for a, b in picture.padding
    ]
    for i, q in enumerate(queries):
        y = MARGIN + i * ch
        runs = reach.row(picture.index, q)
        tip = f"{row_word} {q}: {_words(bounded_runs_text(runs), column_word)}"
        parts.append(f"<g><title>{escaped(tip)}</title>")
        parts += [_run(a, b, y, cw, ch, "seen") for a, b in _pixels(runs, cw, reach.seq_k)]
        parts.append("</g>")
        parts += [
            _run(a, b, y, cw, ch, "flag")
            for a, b in _pixels(picture.marks.get(q, ()), cw, reach.seq_k)
        ]
    if cw >= 6 and ch >= 6:  # small enough to tell cells apart: a white grid between them
        parts += [
            _line(MARGIN + k * cw, MARGIN, MARGIN + k * cw, MARGIN + height)
            for k in range(1, reach.seq_k)
        ]
        parts += [
            _line(MARGIN, MARGIN + i * ch, MARGIN + width, MARGIN + i * ch)
            for i in range(1, len(queries))
        ]
    parts += [
        f'<text x="{MARGIN}" y="{MARGIN - 6}">{column_word} 0</text>',
        f'<text x="{_n(MARGIN + width)}" y="{MARGIN - 6}" text-anchor="end">{reach.seq_k - 1}</text>',
        f'<text x="{MARGIN - 4}" y="{_n(MARGIN + ch)}" text-anchor="end">{row_word[0]}{queries[0]}</text>',
        f'<text x="{MARGIN - 4}" y="{_n(MARGIN + height)}" text-anchor="end">{row_word[0]}{queries[-1]}</text>',
    ]
    last = bounded_runs_text(reach.row(picture.index, queries[-1]))
    title = f"{picture.label}: {row_word} {queries[-1]} sees {_words(last, column_word)}"
    return (
        f'<svg class="reach" role="img" '
        f'width="{_n(MARGIN + width + 8)}" height="{_n(MARGIN + height + 4)}">'
        f"<title>{escaped(title)}</title>{''.join(parts)}</svg>"
    )


def _words(runs_text: str, column_word: str) -> str:
    """`keys 0..5` in the columns' own word: `inputs 0..5`."""
    return runs_text.replace("keys", column_word + "s").replace("key", column_word)


def _pixels(runs, cw: float, keys: int) -> list[tuple[float, float]]:
    """`runs` as drawn at `cw` pixels a key: where a pixel holds several keys, runs that
    meet in one pixel are one rect (a scattered row is at most one rect a pixel, not one
    a run)."""
    if cw >= 1:
        return list(runs)
    out: list[tuple[float, float]] = []
    for a, b in runs:
        start, stop = math.floor(a * cw) / cw, min(math.ceil(b * cw) / cw, keys)
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _run(a: float, b: float, y: float, cw: float, ch: float, kind: str) -> str:
    return (
        f'<rect class="{kind}" x="{_n(MARGIN + a * cw)}" y="{_n(y)}" width="{_n((b - a) * cw)}" '
        f'height="{_n(ch)}"/>'
    )


def _line(x1: float, y1: float, x2: float, y2: float) -> str:
    return f'<line class="grid" x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}"/>'


def _n(value: float) -> str:
    """A coordinate, short: `12`, `3.5`."""
    return f"{value:.2f}".rstrip("0").rstrip(".")
