"""The HTML report's attention flow: one SVG diagram per block of the trace, its
boxes laid out in rows and columns, with edges between them."""

import os

from . import _flow
from ._html_page import escaped
from ._html_source import line_anchor
from .text import human_bytes

_CHAR_W = 6.7  # px per character of the 11px monospace font in the diagram
_ROW_GAP = 34
_COL_GAP = 18


def _node_lines(node: _flow.Node, trace, wrap: int = 60) -> list[tuple[str, str]]:
    """(css class, text) lines of one diagram box; findings wrapped at `wrap` characters."""
    lines = [("title", node.title + ("  ·  " + " · ".join(node.ops) if node.ops else ""))]
    record = node.record
    if record is not None:
        name = record.label or record.role or "tensor"
        if record.role and record.role != name.removesuffix("^T") and node.stage != "input":
            name = f"{name} ({record.role})"
        lines.append(("meta", f"{name}  {record.dtype}  {human_bytes(record.nbytes)}"))
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


def flow_section(trace, blocks: list[_flow.Block]) -> str:
    drawn = [b for b in blocks if b.nodes]
    if not drawn:
        return '<p class="note">No tensor ops were recorded.</p>'
    parts = []
    for number, block in enumerate(drawn):
        same = ""
        if block.same_as:
            shown = ", ".join(block.same_as[:6]) + (" ..." if len(block.same_as) > 6 else "")
            same = f'<p class="note">Same shapes in {len(block.same_as)} more: {escaped(shown)}</p>'
        parts.append(
            f'<figure class="flow"><figcaption>{escaped(block.name)}</figcaption>'
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
        f'role="img" aria-label="attention flow of {escaped(block.name)}">'
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
                n
                for n in nodes
                if n.stage == "proj"
                and n.events
                and n.events[0].inputs
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
            f'<text class="{css}" x="{x + 10:.0f}" y="{y + 20 + 15 * i:.0f}">{escaped(content)}</text>'
        )
    badges = "".join(
        f'<a href="#finding-{n + 1}"><circle class="badge {trace.findings[n].severity}" '
        f'cx="{x + width - 14 - 22 * k:.0f}" cy="{y:.0f}" r="10"/>'
        f'<text class="badge-text" x="{x + width - 14 - 22 * k:.0f}" y="{y + 4:.0f}">{n + 1}</text></a>'
        for k, n in enumerate(node.findings)
    )
    tooltip = (
        "\n".join(f"#{e.index} {e.op} at {e.location}: {e.source}" for e in node.events[-8:])
        or node.failed_op
    )
    rect = f'<rect x="{x:.0f}" y="{y:.0f}" width="{width}" height="{height:.0f}" rx="7"/>'
    inner = f"<title>{escaped(tooltip)}</title>{rect}{''.join(text)}"
    anchor = line_anchor(node.location) if node.location else ""
    if not anchor and node.findings:
        anchor = f"finding-{node.findings[0] + 1}"
    if anchor:
        inner = f'<a href="#{anchor}">{inner}</a>'
    return f'<g class="{classes}">{inner}{badges}</g>'
