"""The HTML report's drawing of the reach `shapeguard check` measured: per example, a
matrix of which inputs move which outputs, the padded inputs shaded and the
counterexamples marked. A pure function of the reach probe's JSON record
(`MeasuredReach.to_dict()`): no torch, no tensor.

s37-show draws each attention site's reach in this package; until the two share a
drawing, this one is the probe's own, kept small.
"""

from ._html_page import escaped

DRAWN_EXAMPLES = 4  # matrices drawn at most; the JSON holds every measured example
_SIDE = 320  # the longest side of a matrix, in pixels


def probe_reach_section(record: dict) -> str:
    """The section's HTML for the reach probe's record (`result.reach.to_dict()`)."""
    inputs = record["inputs"]
    positions = record["positions"]
    rows = len(record["rows"][0]) if record["rows"] else 0
    cell = max(2, min(14, _SIDE // max(inputs, rows, 1)))
    about = (
        f"Measured by {escaped(record['how'])}. Row i is output position "
        f"{'i' if positions is None or len(positions) == record['outputs'] else 'i of those measured'}"
        f", column j is input position j of the same example; a dark cell is an input that "
        "moves that output. Shaded columns are padding, red cells the counterexamples found."
        if positions is not None
        else f"Measured by {escaped(record['how'])}. The output keeps no positions: one row per "
        "example; a dark cell is an input that moves it."
    )
    figures = "".join(
        _matrix(record, e, cell) for e in range(min(record["examples"], DRAWN_EXAMPLES))
    )
    shown = (
        f" ({DRAWN_EXAMPLES} of {record['examples']} measured examples drawn)"
        if record["examples"] > DRAWN_EXAMPLES
        else ""
    )
    return (
        f'<p class="note">{about}{shown}</p><div class="reach-probe">{figures}</div>'
        f"{_crossing(record)}"
    )


def _matrix(record: dict, example: int, cell: int) -> str:
    inputs = record["inputs"]
    rows = record["rows"][example]
    positions = record["positions"] or [0] * len(rows)
    shapes = []
    pad = record["padding"][example] if example < len(record["padding"]) else []
    for a, b in pad:
        shapes.append(
            f'<rect class="pad" x="{a * cell}" y="0" width="{(b - a) * cell}" '
            f'height="{len(rows) * cell}" fill="#ddd"/>'
        )
    for i, runs in enumerate(rows):
        label = f"output {positions[i]}: " + (
            ", ".join(f"{a}..{b - 1}" if b - a > 1 else f"{a}" for a, b in runs) or "no input"
        )
        shapes.append(f"<g><title>{escaped(label)}</title>")
        for a, b in runs:
            shapes.append(
                f'<rect class="seen" x="{a * cell}" y="{i * cell}" width="{(b - a) * cell}" '
                f'height="{cell}" fill="#1f4e8c"/>'
            )
        shapes.append("</g>")
    for mark in record["marks"]:
        if mark["example"] != example or mark["output"] not in positions:
            continue
        i = positions.index(mark["output"])
        for a, b in mark["inputs"]:
            shapes.append(
                f'<rect class="mark" x="{a * cell}" y="{i * cell}" width="{(b - a) * cell}" '
                f'height="{cell}" fill="#d62728" stroke="#000"/>'
            )
    width, height = inputs * cell, len(rows) * cell
    return (
        f'<figure><svg width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="reach of example {example}">'
        f'<rect width="{width}" height="{height}" fill="#fff" stroke="#999"/>'
        f"{''.join(shapes)}</svg><figcaption>example {example}</figcaption></figure>"
    )


def _crossing(record: dict) -> str:
    if not record["crossing"]:
        return '<p class="note ok">No example moves another.</p>'
    items = "".join(
        f"<li>example {c['output_example']}'s outputs move with example "
        f"{c['input_example']}'s inputs ({c['cells']} cells)</li>"
        for c in record["crossing"]
    )
    return f'<ul class="crossing">{items}</ul>'
