"""The HTML report: one self-contained file with the attention flow, findings, source,
heatmaps and memory of a trace.

`render_html(trace)` is a pure function of the trace's records (shapes, never
tensors): no network, no CDN, only inline CSS, SVG, PNG data URIs and a few
lines of JavaScript for hover read-outs; the page is complete without them.
Attention heatmaps need values, which a trace never keeps: get them from one
separate forward with `capture_attention(model, *inputs)` and pass the result
as `attention=`. `shapeguard trace FILE --html report.html` does both on cpu.
`render_fragment(trace)` is the part a notebook shows (`Trace._repr_html_`).
"""

import html
import json
import linecache
import os
import re

from .. import _ops
from .._names.roles import ROLES
from . import _flow
from ._capture import capture_attention as capture_attention
from ._png import color, heatmap_uri
from .text import ATTENTION_OPS, _human_bytes

__all__ = ["capture_attention", "render_fragment", "render_html"]

_CHAR_W = 6.7  # px per character of the 11px monospace font in the diagram
_ROW_GAP = 34
_COL_GAP = 18
_MAX_OPS_LISTED = 3000
_MAX_HOVER_CELLS = 200_000
# Sequence lengths of the score-memory table, past the traced one.
_SCALE_SEQS = (512, 2048, 8192, 32768, 131072)


def render_html(
    trace,
    attention: dict | None = None,
    *,
    title: str = "shapeguard report",
    checks: list[tuple[str, str, str]] | None = None,
) -> str:
    """One self-contained HTML page for `trace`.

    Args:
        trace: a `shapeguard.Trace`.
        attention: optional weights from `capture_attention(model, *inputs)`, drawn
            as per-head heatmaps for batch element 0. Omit it for a shapes-only report.
        title: the page title.
        checks: `shapeguard check`'s (check, status, detail) rows: a Checks section, and
            the verdict counts the failed ones.

    Returns:
        The page, as a string; write it to a `.html` file and open it in any browser.

    Examples:
        >>> import torch, shapeguard
        >>> from shapeguard.report.html import render_html
        >>> page = render_html(shapeguard.trace(torch.nn.Linear(3, 4), torch.zeros(2, 3)))
        >>> page.startswith("<!DOCTYPE html>"), "http" in page
        (True, False)
    """
    blocks = _flow.build_blocks(trace)
    sections = [] if checks is None else [("checks", "Checks", _checks_section(checks))]
    sections += [
        ("flow", "Attention flow", _flow_section(trace, blocks)),
        ("findings", f"Findings ({len(trace.findings)})", _findings_section(trace)),
        ("source", "Source", _source_section(trace)),
        ("heatmaps", "Attention weights", _heatmap_section(trace, attention)),
        ("memory", "Memory", _memory_section(trace)),
        ("ops", f"All ops ({len(trace.events)})", _ops_section(trace)),
    ]
    nav = "".join(f'<a href="#{key}">{_e(name)}</a>' for key, name, _ in sections)
    body = "".join(
        f'<section id="{key}"><h2>{_e(name)}</h2>{content}</section>' for key, name, content in sections
    )
    return _fill(
        _PAGE,
        title=_e(title),
        css=_CSS,
        trap=_ERROR_TRAP,
        script=_SCRIPT,
        header=_header(trace, title, checks),
        nav=nav,
        body=body,
        hover=_hover_data(attention),
    )


def _fill(template: str, **values: str) -> str:
    # One pass, so braces in the CSS, the script or the values are left alone.
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)


def _e(text) -> str:
    return html.escape(str(text), quote=True)


# -- header ---------------------------------------------------------------------------
def _header(trace, title: str, checks=None) -> str:
    from .._version import __version__

    devices = sorted({r.device for e in trace.events for r in e.outputs}) or ["-"]
    errors, warnings = len(trace.errors), len(trace.warnings)
    status = "error" if errors else "warning" if warnings else "ok"
    verdict = (
        f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
        if errors or warnings
        else "no findings"
    )
    if checks is not None:
        status, verdict = _checks_verdict(checks, status)
    dropped = f" ({trace.dropped_events} more not recorded)" if trace.dropped_events else ""
    return (
        f"<header><h1>{_e(title)}</h1>"
        f'<p class="summary"><span class="verdict {status}">{_e(verdict)}</span> '
        f"{len(trace.events)} ops{dropped} in {trace.modules_seen} modules · "
        f"device {_e(', '.join(devices))} · mode {_e(trace.mode)}"
        f"{' (strict)' if trace.strict else ''} · shapeguard {_e(__version__)}</p></header>"
    )


def _checks_verdict(checks, status: str) -> tuple[str, str]:
    """(css class, words) of the header's verdict over `shapeguard check`'s rows: an
    inconclusive probe proves nothing either way, so it is counted apart and never read
    as passed (nor as failed)."""
    results = [result for _, result, _ in checks]
    failed = results.count("FAIL")
    unsure = results.count("inconclusive")
    if failed:
        return "error", f"{failed} check{'s' * (failed != 1)} failed"
    if not unsure:
        return status, "all checks passed"
    return "inconclusive", f"none failed, {unsure} inconclusive"


# -- flow diagram ---------------------------------------------------------------------
def _node_lines(node: _flow.Node, trace, wrap: int = 60) -> list[tuple[str, str]]:
    """(css class, text) lines of one diagram box; findings wrapped at `wrap` characters."""
    lines = [("title", node.title + ("  ·  " + " · ".join(node.ops) if node.ops else ""))]
    record = node.record
    if record is not None:
        name = record.label or record.role or "tensor"
        if record.role and record.role != name.removesuffix("^T") and node.stage != "input":
            name = f"{name} ({record.role})"
        lines.append(("meta", f"{name}  {record.dtype}  {_human_bytes(record.nbytes)}"))
        lines.append(("shape", record.named_shape))
    for label, extra in node.extra:
        lines.append(("meta", f"{label} {extra.named_shape}"))
    for number in node.findings:
        finding = trace.findings[number]
        lines.extend(("finding", part) for part in _wrap(f"#{number + 1} {finding.headline}", wrap))
    if node.location:
        lines.append(("loc", os.path.basename(node.location)))
    return lines


def _wrap(text: str, width: int) -> list[str]:
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def _row_of(node: _flow.Node) -> int:
    return _flow.ROWS.index(node.rows()[0])


def _flow_section(trace, blocks: list[_flow.Block]) -> str:
    drawn = [b for b in blocks if b.nodes]
    if not drawn:
        return '<p class="note">No tensor ops were recorded.</p>'
    parts = []
    for number, block in enumerate(drawn):
        same = ""
        if block.same_as:
            shown = ", ".join(block.same_as[:6]) + (" ..." if len(block.same_as) > 6 else "")
            same = f'<p class="note">Same shapes in {len(block.same_as)} more: {_e(shown)}</p>'
        parts.append(
            f'<figure class="flow"><figcaption>{_e(block.name)}</figcaption>'
            f"{_svg(trace, block, number)}{same}</figure>"
        )
    legend = (
        '<p class="note">Each box is one step of the attention math with the tensor it made: '
        "its name, dtype, bytes and shape with axis names. Red boxes hold errors, orange ones "
        "warnings; a dashed box is an op that was stopped before it ran. Click a box to see its "
        "source line.</p>"
    )
    return legend + "".join(parts)


def _svg(trace, block: _flow.Block, number: int) -> str:
    nodes = block.nodes
    # Boxes are as wide as their shapes need; finding text wraps to that width.
    plain = [
        text if css != "title" else text[:44]
        for n in nodes
        for css, text in _node_lines(n, trace)
        if css in ("title", "meta", "shape")
    ]
    longest = max((len(text) for text in plain), default=20)
    width = max(230, min(400, int(longest * _CHAR_W) + 24))
    wrap = int((width - 20) / _CHAR_W)
    lines = {id(n): _fit_title(_node_lines(n, trace, wrap), wrap) for n in nodes}
    total = 3 * width + 2 * _COL_GAP + 20
    rows: dict[int, list[_flow.Node]] = {}
    for node in nodes:
        rows.setdefault(_row_of(node), []).append(node)
    place: dict[int, tuple[float, float, float]] = {}  # id -> (x, y, height)
    y = 10.0
    for row in sorted(rows):
        members = sorted(rows[row], key=_column_order)
        height = max(18 + 15 * len(lines[id(n)]) for n in members)
        slots = _slots(members, width, total)
        for node, x in zip(members, slots, strict=True):
            place[id(node)] = (x, y, 18 + 15 * len(lines[id(node)]))
        y += height + _ROW_GAP
    prefix = f"b{number}"
    edges = "".join(_edge(place[id(a)], place[id(b)], width, prefix) for a, b in _edges(nodes))
    boxes = "".join(_box(trace, n, lines[id(n)], place[id(n)], width) for n in nodes)
    return (
        f'<svg class="diagram" viewBox="0 0 {total} {y - _ROW_GAP + 10:.0f}" width="{total}" '
        f'role="img" aria-label="attention flow of {_e(block.name)}">'
        f'<defs><marker id="{prefix}-arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#8a94a6"/></marker></defs>'
        f"{edges}{boxes}</svg>"
    )


def _fit_title(lines: list[tuple[str, str]], wrap: int) -> list[tuple[str, str]]:
    """Shorten a long title (many ops folded into one box); the tooltip lists them all."""
    css, title = lines[0]
    if len(title) > wrap:
        title = title[: wrap - 3].rstrip(" ·") + " ..."
    return [(css, title), *lines[1:]]


def _column_order(node: _flow.Node) -> int:
    # Q, K, V left to right; anything else keeps the order it was made in (sort is stable).
    return {"Q": 0, "K": 1, "V": 2, "QKV": 1}.get(node.column, 3 if node.record is not None else 4)


def _slots(members: list[_flow.Node], width: int, total: int) -> list[float]:
    columns = [n.column for n in members]
    if all(c in ("Q", "K", "V") for c in columns) and len(set(columns)) == len(columns):
        return [10 + "QKV".index(c) * (width + _COL_GAP) for c in columns]
    span = len(members) * width + (len(members) - 1) * _COL_GAP
    start = (total - span) / 2
    return [start + i * (width + _COL_GAP) for i in range(len(members))]


def _edges(nodes: list[_flow.Node]) -> list[tuple[_flow.Node, _flow.Node]]:
    """Data-flow arrows between boxes: x -> projections -> head splits -> the center line."""
    by_row: dict[int, list[_flow.Node]] = {}
    for node in nodes:
        by_row.setdefault(_row_of(node), []).append(node)

    def first_at_or_after(row: int, center_only: bool = True) -> list[_flow.Node]:
        for r in sorted(by_row):
            if r >= row:
                found = [n for n in by_row[r] if not center_only or n.column in ("", "QKV")]
                if found:
                    return found
        return []

    def column_target(column: str, row: int) -> list[_flow.Node]:
        for r in sorted(by_row):
            if r > row:
                same = [n for n in by_row[r] if n.column == column]
                if same:
                    return same
        if column == "V":
            context = [n for n in nodes if n.stage == "context"]
            if context:
                return context[:1]
        return first_at_or_after(_flow.ROWS.index("scores"))[:1]

    edges: list[tuple[_flow.Node, _flow.Node]] = []
    for node in nodes:
        row = _row_of(node)
        if node.stage == "input":
            targets = [
                n for n in nodes
                if n.stage == "proj" and n.events and n.events[0].inputs
                and (n.events[0].inputs[0].label or "input") == node.column
            ] or first_at_or_after(row + 1, center_only=False)[:1]
        elif node.column in ("Q", "K", "V"):
            targets = column_target(node.column, row)
        elif node.column == "QKV":
            targets = [n for n in by_row.get(row + 1, []) if n.column in ("Q", "K", "V")]
            targets = targets or first_at_or_after(row + 1)[:1]
        else:
            targets = first_at_or_after(row + 1)[:1]
        edges.extend((node, t) for t in targets if t is not node)
    return edges


def _edge(a, b, width: int, prefix: str) -> str:
    ax, ay, ah = a
    bx, by, bh = b
    x1, y1 = ax + width / 2, ay + ah
    x2, y2 = bx + width / 2, by - 2
    side = bx + width + 2 if x1 > bx + width else bx - 2 if x1 < bx else None
    if by - y1 > _ROW_GAP + 4 and side is not None:
        # Skips rows (V goes past scores and softmax to the context): run down the
        # column and enter the box from its side, clear of the boxes between.
        ym = by + bh / 2
        bend = 14 if side < x1 else -14
        d = (
            f"M{x1:.0f},{y1:.0f} L{x1:.0f},{ym - 14:.0f} "
            f"Q{x1:.0f},{ym:.0f} {x1 - bend:.0f},{ym:.0f} L{side:.0f},{ym:.0f}"
        )
    else:
        mid = (y1 + y2) / 2 if y2 > y1 else y1 + 12
        d = f"M{x1:.0f},{y1:.0f} C{x1:.0f},{mid:.0f} {x2:.0f},{mid:.0f} {x2:.0f},{y2:.0f}"
    return f'<path class="edge" d="{d}" marker-end="url(#{prefix}-arrow)"/>'


def _box(trace, node: _flow.Node, lines, where, width: int) -> str:
    x, y, height = where
    severity = ""
    if node.findings:
        kinds = {trace.findings[i].severity for i in node.findings}
        severity = "error" if "error" in kinds else "warning"
    classes = " ".join(
        c for c in ("node", node.stage, severity, "failed" if node.failed_op else "") if c
    )
    text = []
    for i, (css, content) in enumerate(lines):
        text.append(
            f'<text class="{css}" x="{x + 10:.0f}" y="{y + 20 + 15 * i:.0f}">{_e(content)}</text>'
        )
    badges = "".join(
        f'<a href="#finding-{n + 1}"><circle class="badge {trace.findings[n].severity}" '
        f'cx="{x + width - 14 - 22 * k:.0f}" cy="{y:.0f}" r="10"/>'
        f'<text class="badge-text" x="{x + width - 14 - 22 * k:.0f}" y="{y + 4:.0f}">{n + 1}</text></a>'
        for k, n in enumerate(node.findings)
    )
    tooltip = "\n".join(
        f"#{e.index} {e.op} at {e.location}: {e.source}" for e in node.events[-8:]
    ) or node.failed_op
    rect = (
        f'<rect x="{x:.0f}" y="{y:.0f}" width="{width}" height="{height:.0f}" rx="7"/>'
    )
    inner = f"<title>{_e(tooltip)}</title>{rect}{''.join(text)}"
    anchor = _line_anchor(node.location) if node.location else ""
    if not anchor and node.findings:
        anchor = f"finding-{node.findings[0] + 1}"
    if anchor:
        inner = f'<a href="#{anchor}">{inner}</a>'
    return f'<g class="{classes}">{inner}{badges}</g>'


# -- findings ---------------------------------------------------------------------------
def _findings_section(trace) -> str:
    if not trace.findings:
        return '<p class="note ok">No shape errors and no warnings.</p>'
    items = []
    for number, finding in enumerate(trace.findings, start=1):
        where = ""
        if finding.location:
            where = f' at <a href="#{_line_anchor(finding.location)}">{_e(finding.location)}</a>'
        items.append(
            f'<li id="finding-{number}" class="finding {_e(finding.severity)}">'
            f'<p><span class="num">#{number}</span> <b>{_e(finding.severity)}</b> '
            f"<code>{_e(finding.kind)}</code>{where}</p>"
            f"<pre>{_e(finding.message)}</pre></li>"
        )
    return f'<ol class="findings">{"".join(items)}</ol>'


# A check's row class by its result: a probe that does not apply reads as a skipped one.
_ROW_CLASS = {"n/a": "skip"}


def _checks_section(checks) -> str:
    rows = "".join(
        f'<tr class="{_e(_ROW_CLASS.get(result, result.lower()))}"><td>{_e(name)}</td>'
        f"<td><b>{_e(result)}</b></td>"
        f"<td>{_e(detail)}</td></tr>"
        for name, result, detail in checks
    )
    return (
        '<table class="checks"><thead><tr><th>check</th><th>result</th><th>detail</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
    )


def render_fragment(trace) -> str:
    """The report's findings, attention flow and its table of ops, as one `<div>` with its
    own styles, for a notebook cell (`Trace._repr_html_`)."""
    from .text import attention_rows

    head = "".join(f"<th>{h}</th>" for h in ("#", "module", "op", "tensor", "shape", "dtype", "line"))
    rows = "".join(
        "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in (*row[:6], row[7])) + "</tr>"
        for row in attention_rows(trace)
    )
    return (
        f'<div class="shapeguard"><style>{_scoped_css()}</style>'
        f"<p>{_e(_text_summary(trace))}</p>"
        f"{_findings_section(trace)}{_flow_section(trace, _flow.build_blocks(trace))}"
        f'<table class="ops"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
    )


def _scoped_css() -> str:
    """The page's styles, each rule limited to `.shapeguard` (a notebook has its own page)."""
    rules = []
    for rule in _CSS.split("}"):
        selectors, brace, body = rule.partition("{")
        if not brace:
            continue
        scoped = []
        for selector in selectors.split(","):
            selector = selector.strip()
            scoped.append(
                ".shapeguard" if selector in (":root", "body") else f".shapeguard {selector}"
            )
        rules.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(rules)


def _text_summary(trace) -> str:
    from .text import summary_line

    return summary_line(trace)


# -- source -------------------------------------------------------------------------------
def _split_location(location: str) -> tuple[str, int] | None:
    path, _, line = location.rpartition(":")
    return (path, int(line)) if path and line.isdigit() else None


def _line_anchor(location: str) -> str:
    found = _split_location(location)
    if found is None:
        return ""
    path, line = found
    slug = "".join(c if c.isalnum() else "-" for c in path)
    return f"line-{slug}-{line}"


def _source_section(trace) -> str:
    files: dict[str, dict[int, dict]] = {}
    for event in trace.events:
        found = _split_location(event.location)
        if found is None:
            continue
        info = files.setdefault(found[0], {}).setdefault(found[1], {"source": "", "chips": {}, "findings": []})
        info["source"] = info["source"] or event.source
        out = event.outputs[0] if event.outputs else None
        if out is not None and (out.role in ROLES or event.op in ATTENTION_OPS):
            info["chips"][out.label or out.role or event.op] = out.named_shape
    for number, finding in enumerate(trace.findings, start=1):
        found = _split_location(finding.location)
        if found is None:
            continue
        info = files.setdefault(found[0], {}).setdefault(found[1], {"source": "", "chips": {}, "findings": []})
        info["findings"].append((number, finding))
        if not info["source"]:
            info["source"] = finding.source
    if not files:
        return '<p class="note">No source locations were recorded.</p>'
    return "".join(_source_file(path, lines) for path, lines in files.items())


def _source_file(path: str, touched: dict[int, dict]) -> str:
    readable = bool(linecache.getline(path, min(touched)))
    if readable:
        # Each traced line with two lines of context; far-apart parts joined by "...".
        wanted = {n for t in touched for n in range(max(1, t - 2), t + 3)}
        numbers = sorted(n for n in wanted if linecache.getline(path, n))
    else:
        numbers = sorted(touched)
    rows, previous = [], None
    for n in numbers:
        info = touched.get(n)
        text = linecache.getline(path, n).rstrip("\n") if readable else (info or {}).get("source", "")
        if not readable and not text:
            continue
        if previous is not None and n != previous + 1:
            rows.append('<tr class="gap"><td></td><td>...</td><td></td></tr>')
        previous = n
        classes = []
        chips = ""
        notes = ""
        if info is not None:
            classes.append("traced")
            chips = "".join(
                f'<span class="chip"><b>{_e(label)}</b> {_e(shape)}</span>'
                for label, shape in list(info["chips"].items())[-3:]
            )
            for number, finding in info["findings"]:
                classes.append(finding.severity)
                notes += (
                    f'<tr class="note-row {_e(finding.severity)}"><td></td><td colspan="2">'
                    f'<a href="#finding-{number}">#{number}</a> <pre>{_e(finding.message)}</pre></td></tr>'
                )
        anchor = _line_anchor(f"{path}:{n}")
        rows.append(
            f'<tr id="{anchor}" class="{" ".join(dict.fromkeys(classes))}"><td class="ln">{n}</td>'
            f'<td class="code"><code>{_e(text)}</code></td><td class="chips">{chips}</td></tr>{notes}'
        )
    caption = _e(path) + ("" if readable else " (file not readable: traced lines only)")
    return f'<table class="source"><caption>{caption}</caption>{"".join(rows)}</table>'


# -- heatmaps -------------------------------------------------------------------------------
def _heatmap_section(trace, attention: dict | None) -> str:
    if attention is None:
        meta = any(r.device == "meta" for e in trace.events for r in e.outputs)
        why = (
            "This trace ran on the meta device: there are no values to draw."
            if meta
            else "A trace keeps shapes, not values. To see each query's weights over the keys, "
            "per head, pass <code>attention=capture_attention(model, *inputs)</code> to "
            "<code>render_html</code> (<code>shapeguard trace FILE --html</code> does this on cpu)."
        )
        return f'<p class="note">{why}</p>'
    if not attention:
        return (
            '<p class="note">No attention weights were captured: no softmax over 3 or more axes, '
            "no SDPA and no nn.MultiheadAttention ran, or they ran on the meta device.</p>"
        )
    parts = [
        '<p class="note">Batch element 0. Row i is query i, column j is key j; a bright cell '
        "is a key that query attends to. Each row of a correct attention map sums to 1. "
        "Hover a map to read a weight.</p>"
    ]
    for index, (name, entry) in enumerate(attention.items()):
        parts.append(_heatmap_entry(index, name, entry))
    return "".join(parts)


def _heatmap_entry(index: int, name: str, entry: dict) -> str:
    heads = entry.get("heads") or []
    vmax = max((v for head in heads for row in head for v in row), default=0.0)
    seq_q, seq_k = entry.get("size", [0, 0])
    rows = len(heads[0]) if heads else 0
    cols = len(heads[0][0]) if rows else 0
    pooled = f", pooled to {rows} x {cols}" if (rows, cols) != (seq_q, seq_k) else ""
    dim = entry.get("dim", -1)
    axis = "" if dim == -1 else f" (softmax over dim {dim}: columns, not rows, sum to 1)"
    shown = f"{len(heads)} of {entry['shape'][1]} heads" if len(entry.get("shape", [])) == 4 and len(heads) < entry["shape"][1] else f"{len(heads)} head{'s' * (len(heads) != 1)}"
    caption = (
        f"<b>{_e(name)}</b> · {_e(entry.get('op', ''))} · weights {_e(entry.get('shape'))} · "
        f"{shown}, [seq_q={seq_q}, seq_k={seq_k}]{pooled}{_e(axis)}"
    )
    cell = max(2, min(14, 224 // max(rows, cols, 1)))
    figures = "".join(
        f'<figure><img class="heat" alt="head {h}" data-entry="{index}" data-head="{h}" '
        f'width="{cols * cell}" height="{rows * cell}" src="{heatmap_uri(head, vmax)}">'
        f"<figcaption>head {h}</figcaption></figure>"
        for h, head in enumerate(heads)
    )
    ramp = ",".join(f"rgb{color(i / 4)}" for i in range(5))
    legend = (
        f'<span class="legend"><span class="ramp" style="background:linear-gradient(90deg,{ramp})">'
        f"</span> 0 to {vmax:.3g} (color by square root of the weight, so small weights show)</span>"
    )
    return f'<div class="heatmaps"><p>{caption} {legend}</p><div class="grid">{figures}</div></div>'


def _hover_data(attention: dict | None) -> str:
    if not attention:
        return "[]"
    entries = list(attention.values())
    cells = sum(len(r) for e in entries for h in e.get("heads", []) for r in h)
    cells *= max((len(r) for e in entries for h in e.get("heads", []) for r in h[:1]), default=1)
    if cells > _MAX_HOVER_CELLS:
        return "[]"
    data = [[[[round(v, 4) for v in row] for row in head] for head in e.get("heads", [])] for e in entries]
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


# -- memory ------------------------------------------------------------------------------------
def _is_score_shaped(record) -> bool:
    return record.role in ("scores", "attn") or tuple(record.axes[-2:]) == ("seq_q", "seq_k")


def _memory_section(trace) -> str:
    rows = []
    for event in trace.events:
        if not event.outputs:
            continue
        out = event.outputs[0]
        if out.role in ROLES or event.op in ATTENTION_OPS:
            rows.append((event, out))
    if not rows:
        return '<p class="note">No attention tensors were recorded.</p>'
    biggest = max(out.nbytes for _, out in rows) or 1
    body = "".join(
        f'<tr class="{"score" if _is_score_shaped(out) else ""}"><td>{event.index}</td>'
        f"<td>{_e(out.label or out.role or '')}</td><td>{_e(event.op)}</td>"
        f"<td><code>{_e(out.named_shape)}</code></td><td>{_e(out.dtype)}</td>"
        f'<td class="num">{_human_bytes(out.nbytes)}</td>'
        f'<td class="bar"><span style="width:{max(1, round(100 * out.nbytes / biggest))}%"></span></td></tr>'
        for event, out in rows
    )
    table = (
        '<table class="memory"><thead><tr><th>#</th><th>tensor</th><th>op</th><th>shape</th>'
        f"<th>dtype</th><th>bytes</th><th></th></tr></thead><tbody>{body}</tbody></table>"
    )
    return _scores_note(trace, [out for _, out in rows]) + table


def _scores_note(trace, records) -> str:
    scores = [r for r in records if _is_score_shaped(r) and len(r.shape) >= 3]
    if scores:
        peak = max(scores, key=lambda r: r.nbytes)
        total = sum(r.nbytes for r in scores)
        count = len(scores)
        materialized = True
    else:
        peak = _fused_scores(trace)
        if peak is None:
            return '<p class="note">No [batch, heads, seq_q, seq_k] score tensor was recorded.</p>'
        total, count, materialized = peak.nbytes, 1, False
    shape = peak.shape
    batch = shape[0] if len(shape) == 4 else 1
    heads = shape[1] if len(shape) == 4 else shape[0]
    seq_q, seq_k = shape[-2], shape[-1]
    numel = batch * heads * seq_q * seq_k
    itemsize = max(1, peak.nbytes // numel) if numel else 4
    stats = batch * heads * seq_q * 4  # flash-attn keeps one float32 logsumexp per query row
    if materialized:
        lead = (
            f"<p>The largest score tensor is <code>{_e(peak.named_shape)}</code> {_e(peak.dtype)}: "
            f"<b>{_human_bytes(peak.nbytes)}</b>. This forward made {count} tensors of that "
            f"[batch, heads, seq_q, seq_k] shape (scores, scaled, masked, softmax), "
            f"<b>{_human_bytes(total)}</b> in all; training keeps them for the backward pass.</p>"
        )
    else:
        lead = (
            f"<p>The fused kernel computes scores of shape <code>{_e(peak.named_shape)}</code> "
            f"internally. Its math (fallback) kernel would materialize "
            f"<b>{_human_bytes(peak.nbytes)}</b> for them; the flash and memory-efficient kernels "
            "do not.</p>"
        )
    saving = max(0, total - stats)
    flash = (
        f"<p>The score tensor grows with seq²: doubling the sequence quadruples it. FlashAttention "
        f"computes the same output tile by tile in on-chip memory and never materializes "
        f"[seq_q, seq_k]; it keeps one float32 per query row for the backward pass "
        f"(batch × heads × seq_q × 4 B = {_human_bytes(stats)}). At this size it would save about "
        f"<b>{_human_bytes(saving)}</b>.</p>"
    )
    seqs = [seq_k] + [s for s in _SCALE_SEQS if s > seq_k][:4]
    scale_rows = "".join(
        f'<tr><td class="num">{s:,}</td>'
        f'<td class="num">{_human_bytes(batch * heads * s * s * itemsize)}</td>'
        f'<td class="num">{_human_bytes(count * batch * heads * s * s * itemsize)}</td>'
        f'<td class="num">{_human_bytes(batch * heads * s * 4)}</td></tr>'
        for s in seqs
    )
    table = (
        f'<table class="scale"><caption>batch={batch}, heads={heads}, {_e(peak.dtype)}, '
        "seq_q = seq_k = seq</caption><thead><tr><th>seq</th><th>one score tensor</th>"
        f"<th>{count} score tensor{'s' * (count != 1)}</th><th>FlashAttention row stats</th>"
        f"</tr></thead><tbody>{scale_rows}</tbody></table>"
    )
    return lead + flash + table


def _fused_scores(trace):
    """The [batch, heads, seq_q, seq_k] record an SDPA call would need, from its q and k."""
    from .._trace.record import TensorRecord

    for event in trace.events:
        if event.op not in _flow.FUSED_OPS or len(event.inputs) < 2:
            continue
        q, k = event.inputs[0], event.inputs[1]
        if len(q.shape) != 4 or len(k.shape) != 4:
            continue
        if _ops.declared(event.op) is _ops.SDPA:
            b, h, sq, _ = q.shape
            sk = k.shape[2]
        else:  # flash-attn's [batch, seq, heads, d] layout
            b, sq, h, _ = q.shape
            sk = k.shape[1]
        numel = b * h * sq * sk
        itemsize = max(1, q.nbytes // max(1, _prod(q.shape)))
        return TensorRecord(
            label="scores", role="scores", shape=(b, h, sq, sk),
            axes=("batch", "heads", "seq_q", "seq_k"), dtype=q.dtype, nbytes=numel * itemsize,
        )
    return None


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# -- all ops -------------------------------------------------------------------------------------
def _ops_section(trace) -> str:
    if not trace.events:
        return '<p class="note">No ops were recorded.</p>'
    rows = "".join(
        f"<tr><td>{e.index}</td><td>{_e(e.module or e.module_type or '-')}</td><td>{_e(e.op)}</td>"
        f"<td><code>{_e(', '.join(r.named_shape for r in e.inputs[:3]))}</code></td>"
        f"<td><code>{_e(', '.join((r.label + ' ' if r.label else '') + r.named_shape for r in e.outputs[:3]))}</code></td>"
        f"<td>{_e(os.path.basename(e.location))}</td></tr>"
        for e in trace.events[:_MAX_OPS_LISTED]
    )
    more = len(trace.events) - _MAX_OPS_LISTED
    tail = f'<p class="note">{more} more ops not listed.</p>' if more > 0 else ""
    return (
        "<details><summary>every recorded op, its inputs and outputs</summary>"
        '<table class="ops"><thead><tr><th>#</th><th>module</th><th>op</th><th>inputs</th>'
        f"<th>outputs</th><th>line</th></tr></thead><tbody>{rows}</tbody></table>{tail}</details>"
    )


# -- page ------------------------------------------------------------------------------------------
# The first script only records errors (in the title and the body's data), so a
# test in a real browser can tell a broken page from a working one.
_ERROR_TRAP = (
    "window.__errors=[];window.addEventListener('error',function(e){"
    "window.__errors.push(String(e.message));document.title='JS ERROR: '+e.message;"
    "if(document.body){document.body.setAttribute('data-js-error',String(e.message));}});"
)

_SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('heat-data').textContent);
  var tip = document.getElementById('tip');
  document.querySelectorAll('img.heat').forEach(function (img) {
    img.addEventListener('mousemove', function (ev) {
      var head = (data[+img.dataset.entry] || [])[+img.dataset.head];
      if (!head) { return; }
      var r = Math.min(head.length - 1, Math.floor(ev.offsetY / img.height * head.length));
      var c = Math.min(head[0].length - 1, Math.floor(ev.offsetX / img.width * head[0].length));
      tip.textContent = 'head ' + img.dataset.head + ', query ' + r + ', key ' + c + ': ' + head[r][c];
      tip.style.left = (ev.pageX + 12) + 'px';
      tip.style.top = (ev.pageY + 12) + 'px';
      tip.hidden = false;
    });
    img.addEventListener('mouseleave', function () { tip.hidden = true; });
  });
  document.body.setAttribute('data-ready', '1');
})();
"""

_CSS = """
:root { --fg:#1d2330; --muted:#5b6577; --line:#d9dee7; --bg:#f7f8fb; --err:#c62828;
  --warn:#d97706; --ok:#2e7d32; --accent:#3451b2; --unsure:#7b3fa0; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif; color:var(--fg);
  background:#fff; }
header { padding:18px 28px 8px; border-bottom:1px solid var(--line); background:var(--bg); }
h1 { margin:0 0 4px; font-size:22px; }
h2 { font-size:18px; margin:28px 0 10px; border-bottom:1px solid var(--line); padding-bottom:4px; }
nav { position:sticky; top:0; background:#fff; padding:6px 28px; border-bottom:1px solid var(--line);
  z-index:2; }
nav a { margin-right:16px; color:var(--accent); text-decoration:none; font-weight:600; }
main { padding:0 28px 40px; max-width:1400px; }
.summary { margin:0; color:var(--muted); }
.verdict { font-weight:700; padding:1px 8px; border-radius:10px; color:#fff; }
.verdict.ok { background:var(--ok); } .verdict.warning { background:var(--warn); }
.verdict.error { background:var(--err); } .verdict.inconclusive { background:var(--unsure); }
.note { color:var(--muted); } .note.ok { color:var(--ok); font-weight:600; }
code, pre { font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; font-size:12px; }
pre { margin:4px 0; white-space:pre-wrap; }
figure.flow { margin:0 0 24px; overflow-x:auto; }
figure.flow figcaption { font-weight:700; margin-bottom:6px; }
svg.diagram { display:block; max-width:100%; height:auto; }
svg .edge { fill:none; stroke:#8a94a6; stroke-width:1.6; }
svg .node rect { fill:#fff; stroke:#9aa5b8; stroke-width:1.4; }
svg .node.input rect { fill:#eef2f7; }
svg .node.proj rect, svg .node.split rect { fill:#f3f6ff; }
svg .node.scores rect, svg .node.mask rect, svg .node.softmax rect { fill:#fff8ec; }
svg .node.context rect, svg .node.merge rect, svg .node.out rect { fill:#f1faf3; }
svg .node.fused rect, svg .node.mha rect { fill:#f6f0ff; }
svg .node.warning rect { stroke:var(--warn); stroke-width:3; }
svg .node.error rect { stroke:var(--err); stroke-width:3; fill:#fff1f1; }
svg .node.failed rect { stroke-dasharray:6 4; }
svg a:hover rect { stroke:var(--accent); }
svg text { font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; font-size:11px;
  fill:var(--fg); }
svg text.title { font-family:system-ui,sans-serif; font-weight:700; font-size:12px; }
svg text.meta, svg text.loc { fill:var(--muted); }
svg text.shape { fill:#1b5e20; font-weight:600; }
svg text.finding { fill:var(--err); }
svg .warning text.finding { fill:#9a4f00; }
svg circle.badge.error { fill:var(--err); } svg circle.badge.warning { fill:var(--warn); }
svg text.badge-text { fill:#fff; font-weight:700; text-anchor:middle; font-family:system-ui; }
ol.findings { padding-left:0; list-style:none; }
li.finding { border-left:5px solid var(--line); background:var(--bg); padding:6px 12px;
  margin-bottom:10px; }
li.finding.error { border-color:var(--err); } li.finding.warning { border-color:var(--warn); }
li.finding p { margin:0; } .num { font-weight:700; }
table { border-collapse:collapse; margin:6px 0 18px; }
caption { text-align:left; font-weight:700; padding:4px 0; }
th, td { padding:2px 8px; border-bottom:1px solid var(--line); text-align:left; vertical-align:top; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
table.source { width:100%; font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace; }
table.source td { border:none; padding:0 8px; }
table.source td.ln { color:var(--muted); text-align:right; width:3em; user-select:none; }
table.source tr.traced td.code { background:#f3f6ff; }
table.source tr.warning td.code { background:#fff4e0; } table.source tr.error td.code { background:#ffe9e9; }
table.source tr:target td { outline:2px solid var(--accent); }
table.source code { white-space:pre; }
table.source tr.note-row td { padding:2px 8px 8px; }
table.source tr.note-row pre { display:inline-block; vertical-align:top; margin:0 0 0 6px;
  border-left:4px solid var(--err); padding-left:8px; }
table.source tr.note-row.warning pre { border-color:var(--warn); }
.chip { display:inline-block; font-size:11px; background:#eef2f7; border-radius:8px; padding:0 6px;
  margin:1px 4px 1px 0; white-space:nowrap; }
.heatmaps .grid { display:flex; flex-wrap:wrap; gap:12px; }
.heatmaps figure { margin:0; text-align:center; font-size:12px; color:var(--muted); }
img.heat { image-rendering:pixelated; border:1px solid var(--line); display:block; }
.legend { color:var(--muted); margin-left:10px; white-space:nowrap; }
.ramp { display:inline-block; width:90px; height:10px; vertical-align:middle; border-radius:2px; }
table.memory tr.score td { background:#fff8ec; }
table.checks tr.fail td { background:#ffe9e9; } table.checks tr.skip td { color:var(--muted); }
table.checks tr.inconclusive td { background:#f4ecfa; } table.checks tr.inconclusive b { color:var(--unsure); }
td.bar { width:180px; } td.bar span { display:block; height:10px; background:#7b8fd1; border-radius:2px; }
#tip { position:absolute; background:#1d2330; color:#fff; font-size:12px; padding:2px 6px;
  border-radius:4px; pointer-events:none; }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<script>{trap}</script>
<style>{css}</style>
</head>
<body>
{header}
<nav>{nav}</nav>
<main>{body}</main>
<div id="tip" hidden></div>
<script type="application/json" id="heat-data">{hover}</script>
<script>{script}</script>
</body>
</html>
"""
