"""The HTML report's memory section: the attention tensors a trace recorded, their bytes, and
what the scores cost at longer sequences."""

from .. import _ops
from .._names.roles import ROLES
from . import _flow
from ._html_page import escaped
from .text import ATTENTION_OPS, human_bytes

# Sequence lengths of the score-memory table, past the traced one.
_SCALE_SEQS = (512, 2048, 8192, 32768, 131072)


def _is_score_shaped(record) -> bool:
    return record.role in ("scores", "attn") or tuple(record.axes[-2:]) == ("seq_q", "seq_k")


def memory_section(trace) -> str:
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
        f"<td>{escaped(out.label or out.role or '')}</td><td>{escaped(event.op)}</td>"
        f"<td><code>{escaped(out.named_shape)}</code></td><td>{escaped(out.dtype)}</td>"
        f'<td class="num">{human_bytes(out.nbytes)}</td>'
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
            f"<p>The largest score tensor is <code>{escaped(peak.named_shape)}</code> {escaped(peak.dtype)}: "
            f"<b>{human_bytes(peak.nbytes)}</b>. This forward made {count} tensors of that "
            f"[batch, heads, seq_q, seq_k] shape (scores, scaled, masked, softmax), "
            f"<b>{human_bytes(total)}</b> in all; training keeps them for the backward pass.</p>"
        )
    else:
        lead = (
            f"<p>The fused kernel computes scores of shape <code>{escaped(peak.named_shape)}</code> "
            f"internally. Its math (fallback) kernel would materialize "
            f"<b>{human_bytes(peak.nbytes)}</b> for them; the flash and memory-efficient kernels "
            "do not.</p>"
        )
    saving = max(0, total - stats)
    flash = (
        f"<p>The score tensor grows with seq²: doubling the sequence quadruples it. FlashAttention "
        f"computes the same output tile by tile in on-chip memory and never materializes "
        f"[seq_q, seq_k]; it keeps one float32 per query row for the backward pass "
        f"(batch × heads × seq_q × 4 B = {human_bytes(stats)}). At this size it would save about "
        f"<b>{human_bytes(saving)}</b>.</p>"
    )
    seqs = [seq_k] + [s for s in _SCALE_SEQS if s > seq_k][:4]
    scale_rows = "".join(
        f'<tr><td class="num">{s:,}</td>'
        f'<td class="num">{human_bytes(batch * heads * s * s * itemsize)}</td>'
        f'<td class="num">{human_bytes(count * batch * heads * s * s * itemsize)}</td>'
        f'<td class="num">{human_bytes(batch * heads * s * 4)}</td></tr>'
        for s in seqs
    )
    table = (
        f'<table class="scale"><caption>batch={batch}, heads={heads}, {escaped(peak.dtype)}, '
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
            label="scores",
            role="scores",
            shape=(b, h, sq, sk),
            axes=("batch", "heads", "seq_q", "seq_k"),
            dtype=q.dtype,
            nbytes=numel * itemsize,
        )
    return None


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
