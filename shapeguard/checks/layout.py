"""Layouts that run and compute the wrong thing: attention over the wrong axis.

- SDPA given `[batch, seq, heads, d_k]`: it attends across heads, per token.
- `nn.MultiheadAttention(batch_first=False)` given `[batch, seq, embed]`: it reads the
  batch as the sequence and attends across examples.
- rotary cos/sin whose position axis lines up with the heads (or feature) axis.

Softmax over the query axis is the softmax family's (`softmax_axis`). Each rule
needs the axis names to say so; where sizes coincide and names are unknown, it
stays quiet.
"""

import re

from .. import _ops
from .._errors import Violation
from . import WARNING, rule

_SEQ_AXES = ("seq", "seq_q", "seq_k")
_HEAD_AXES = ("heads", "kv_heads")


def _is_tensor(value) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")


# -- SDPA ----------------------------------------------------------------------------
@rule(_ops.SDPA, kinds={"layout_bshd": WARNING}, order=1)
def sdpa_layout(call):
    names = ("query", "key", "value")
    tensors = [
        call.args[i] if len(call.args) > i else call.kwargs.get(n) for i, n in enumerate(names)
    ]
    if not all(_is_tensor(t) and t.dim() == 4 for t in tensors):
        return
    q, k, v = tensors
    if not (q.shape[0] == k.shape[0] == v.shape[0] and k.shape[:-1] == v.shape[:-1]):
        return  # a loud mismatch: the sdpa family reports it
    bshd = [_is_bshd(call, t) for t in tensors]
    if not all(bshd):
        return
    labels = [call.label(i, n[0]) for i, n in enumerate(names)]
    lq = labels[0]
    axes = call.axes(q)
    yield Violation(
        "layout_bshd",
        f"scaled_dot_product_attention: {lq} is [batch, {axes[1]}, {axes[2]}, d_k]: SDPA reads "
        f"axis 1 as heads and axis 2 as the sequence, so it attends across the "
        f"{q.shape[2]} heads of each token instead of across the {q.shape[1]} tokens",
        tuple(call.operand(label, t) for label, t in zip(labels, tensors, strict=True)),
        f"SDPA wants [batch, heads, seq, d_k]: pass {lq}.transpose(1, 2) (and the same for "
        f"{labels[1]} and {labels[2]}), then transpose the output back with .transpose(1, 2)",
        severity="warning",
    )


def _is_bshd(call, t) -> bool:
    axes = call.axes(t)
    return bool(axes) and axes[2] in _HEAD_AXES and axes[1] in _SEQ_AXES


# -- nn.MultiheadAttention -------------------------------------------------------------
@rule(_ops.MHA, kinds={"mha_batch_first": WARNING}, order=1)
def mha_batch_first(call):
    module = call.module
    if module is None or getattr(module, "batch_first", True):
        return
    root = call.session.root
    # A torch module at the root defines its own layout through batch_first: the trace
    # then has no independent word on which axis is the batch.
    if root is None or type(root).__module__.startswith("torch.nn"):
        return
    query = call.args[0] if call.args else call.kwargs.get("query")
    if not _is_tensor(query) or query.dim() != 3 or query.shape[0] == query.shape[1]:
        return
    axes = call.axes(query)
    if not axes or axes[0] != "batch" or axes[1] not in _SEQ_AXES:
        return
    label = call.label(0, "query")
    b, s, e = (int(n) for n in query.shape)
    yield Violation(
        "mha_batch_first",
        f"MultiheadAttention(batch_first=False) got {label} [batch={b}, {axes[1]}={s}, "
        f"embed_dim={e}]: it reads [seq, batch, embed_dim], so it attends across the {b} "
        f"examples of the batch, once per token",
        (call.operand(label, query),),
        "build nn.MultiheadAttention(..., batch_first=True), or pass "
        f"{label}.transpose(0, 1) (and the same for key and value) and transpose the output back",
        severity="warning",
    )


# -- rotary embeddings ---------------------------------------------------------------
_ROTARY_NAME = re.compile(r"(^|[^a-z])(cos|sin)([^a-z]|$)|rotary|rope|freqs")


def _rotary_like(call, tensor, label: str) -> bool:
    meta = call.meta(tensor)
    if meta is not None and meta.op in ("cos", "sin"):
        return True
    names = [label.lower()]
    if meta is not None and meta.label:
        names.append(meta.label.lower())
    return any(_ROTARY_NAME.search(n) for n in names)


@rule(_ops.by_name("mul"), kinds={"rotary_axis": WARNING}, order=1)
def rotary_axis(call):
    args = call.args
    if len(args) < 2 or not _is_tensor(args[0]) or not _is_tensor(args[1]):
        return
    for x, c, index in ((args[0], args[1], 1), (args[1], args[0], 0)):
        if c.dim() < 2 or x.dim() < c.dim() or x.dim() < 3:
            continue  # cheap tests first: this runs on every multiplication
        c_label = call.label(index, "cos")
        if not _rotary_like(call, c, c_label):
            continue
        x_axes = call.axes(x)
        if not x_axes or x_axes[-1] != "d_k":
            continue
        lead = x.dim() - c.dim()
        for i in range(c.dim() - 1):
            name = x_axes[lead + i]
            if c.shape[i] == 1 or name not in (*_HEAD_AXES, "d_k", "d_model"):
                continue
            x_label = call.label_of(x, "q")
            yield Violation(
                "rotary_axis",
                f"{x_label} * {c_label}: the positions of {c_label} (axis {i - c.dim()}, size "
                f"{c.shape[i]}) line up with {x_label}.{name} ({x.shape[lead + i]}), not with its "
                "sequence axis: each head gets one position's rotation",
                (call.operand(x_label, x), call.operand(c_label, c)),
                _rotary_hint(x_axes, c_label),
                severity="warning",
            )
            return


def _rotary_hint(x_axes, c_label: str) -> str:
    layout = ", ".join(n or "?" for n in x_axes)
    return (
        f"put the position axis of {c_label} on the sequence axis of [{layout}]: "
        f"{c_label} shaped [..., seq, 1, d_k] for [batch, seq, heads, d_k] (unsqueeze_dim=2), "
        "[..., seq, d_k] for [batch, heads, seq, d_k] (unsqueeze_dim=1)"
    )
