"""The HTML report's attention heatmaps: per-head images of the weights from
`capture_attention`, with values for hover read-outs."""

import json

from ._html_page import escaped
from ._png import color, heatmap_uri

_MAX_HOVER_CELLS = 200_000


def heatmap_section(trace, attention: dict | None) -> str:
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
    shown = (
        f"{len(heads)} of {entry['shape'][1]} heads"
        if len(entry.get("shape", [])) == 4 and len(heads) < entry["shape"][1]
        else f"{len(heads)} head{'s' * (len(heads) != 1)}"
    )
    caption = (
        f"<b>{escaped(name)}</b> · {escaped(entry.get('op', ''))} · weights {escaped(entry.get('shape'))} · "
        f"{shown}, [seq_q={seq_q}, seq_k={seq_k}]{pooled}{escaped(axis)}"
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


def hover_data(attention: dict | None) -> str:
    if not attention:
        return "[]"
    entries = list(attention.values())
    cells = sum(len(r) for e in entries for h in e.get("heads", []) for r in h)
    cells *= max((len(r) for e in entries for h in e.get("heads", []) for r in h[:1]), default=1)
    if cells > _MAX_HOVER_CELLS:
        return "[]"
    data = [
        [[[round(v, 4) for v in row] for row in head] for head in e.get("heads", [])]
        for e in entries
    ]
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
