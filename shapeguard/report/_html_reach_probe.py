"""The HTML report's drawing of the reach `shapeguard check` measured: per example, a
matrix of which inputs move which outputs, the padded inputs shaded and the
counterexamples marked. A pure function of the reach probe's JSON record
(`MeasuredReach.to_dict()`): no torch, no tensor.

Each example is drawn by the same SVG drawer as an attention site's reach
(`_html_reach.svg_matrix`), in the words of the probe: outputs and inputs.
"""

from .._reach.rows import Reach
from ._html_page import escaped
from ._html_reach import svg_matrix
from ._reach_view import Picture

DRAWN_EXAMPLES = 4  # matrices drawn at most; the JSON holds every measured example


def probe_reach_section(record: dict) -> str:
    """The section's HTML for the reach probe's record (`result.reach.to_dict()`)."""
    positions = record["positions"]
    about = (
        f"Measured by {escaped(record['how'])}. Row i is output position "
        f"{'i' if positions is None or len(positions) == record['outputs'] else 'i of those measured'}"
        f", column j is input position j of the same example; a dark cell is an input that "
        "moves that output. Shaded columns are padding, red cells the counterexamples found."
        if positions is not None
        else f"Measured by {escaped(record['how'])}. The output keeps no positions: one row per "
        "example; a dark cell is an input that moves it."
    )
    figures = "".join(_matrix(record, e) for e in range(min(record["examples"], DRAWN_EXAMPLES)))
    shown = (
        f" ({DRAWN_EXAMPLES} of {record['examples']} measured examples drawn)"
        if record["examples"] > DRAWN_EXAMPLES
        else ""
    )
    return (
        f'<p class="note">{about}{shown}</p><div class="reach-probe">{figures}</div>'
        f"{_crossing(record)}"
    )


def _matrix(record: dict, example: int) -> str:
    """One measured example drawn as a site's reach is (`_html_reach.svg_matrix`): rows the
    measured outputs, columns the example's inputs."""
    rows = [tuple(tuple(run) for run in runs) for runs in record["rows"][example]]
    positions = record["positions"] or list(range(len(rows)))
    reach = Reach.from_runs(
        rows,
        tuple(positions),
        (record["outputs"] or len(rows)),
        record["inputs"],
        (1,),
    )
    pad = record["padding"][example] if example < len(record["padding"]) else []
    marks: dict[int, tuple] = {}
    for mark in record["marks"]:
        if mark["example"] == example and mark["output"] in positions:
            found = marks.get(mark["output"], ())
            marks[mark["output"]] = found + tuple(tuple(run) for run in mark["inputs"])
    label = f"example {example}"
    picture = Picture(label, (0,), tuple(tuple(run) for run in pad), marks)
    svg = svg_matrix(reach, picture, list(positions), words=("output", "input"))
    return f"<figure>{svg}<figcaption>{escaped(label)}</figcaption></figure>"


def _crossing(record: dict) -> str:
    if not record["crossing"]:
        return '<p class="note ok">No example moves another.</p>'
    items = "".join(
        f"<li>example {c['output_example']}'s outputs move with example "
        f"{c['input_example']}'s inputs ({c['cells']} cells)</li>"
        for c in record["crossing"]
    )
    return f'<ul class="crossing">{items}</ul>'
