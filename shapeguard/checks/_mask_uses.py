"""Every way of masking scores (masked_fill with a large negative value, where with one,
an additive float mask, SDPA's attn_mask, nn.MultiheadAttention's attn_mask and
key_padding_mask) reduced to one boolean tensor, `hidden`, True where a key is hidden
from a query, aligned to the scores `[..., seq_q, seq_k]`: the uses `mask_semantics`
reads."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from .. import _ops
from . import is_tensor
from ._mask_effects import (
    SDPA_TEXTS,
    additive_effect,
    aligned,
    broadcasts_to,
    fill_effect,
    has_shape,
    mha_effect,
    readable,
    result_type,
    scalar_of,
    sdpa_dtype,
    values_effect,
)
from .elementwise import where_arguments
from .mha import bind_arguments

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    import torch


# A fill value at or below this hides a key (−1e9, finfo.min and −inf all do).
HIDING = -1e4


@dataclass(slots=True)
class MaskUse:
    """One mask as an op applies it."""

    op: str  # how the message names the op
    label: str  # the user's name for the mask
    mask: "torch.Tensor | None"  # the mask tensor as given
    hidden: "torch.Tensor"  # bool tensor, True = hidden, right-aligned to len(target) axes
    target: tuple[int, ...]  # the scores' shape [..., seq_q, seq_k]
    # "keep" (True attends: SDPA), "hide" (True hides), "fill", "where" (True keeps the
    # scores: torch.where(keep, scores, fill)), "where_fill" (True takes the fill:
    # torch.where(hide, fill, scores)), "add"
    kind: str
    # What a row that hides every key gives: called only when such rows are reported
    # (with the bool [*target[:-1]] of those rows), so reading values costs nothing
    # on the ops that pass.
    effect: Callable[[object], str]
    # The tensor masked_fill, where or an addition masks (None for SDPA and
    # nn.MultiheadAttention, whose documented arguments say the axes and whose own
    # softmax reads the mask).
    scores: "torch.Tensor | None" = None
    # SDPA's and nn.MultiheadAttention's (query, key) tensors and the index of their
    # sequence axis: which key is each query's own position (`_own_keys`). Masked scores
    # hold both axes themselves.
    operands: "tuple[torch.Tensor, torch.Tensor, int] | None" = None


# -- the mask of each op -------------------------------------------------------------------
def mask_uses(call):
    """The masks `call` applies to attention scores, as `MaskUse`s (none when the values
    cannot be read). The probes use it too, to tell a causal module from the trace."""
    op = call.spec.name
    args = call.args
    if op == "masked_fill":
        if len(args) < 3 or not hasattr(args[1], "dtype"):
            return
        x, mask = args[0], args[1]
        fill = scalar_of(args[2])
        if fill is None or fill > HIDING or mask.dtype.is_floating_point or x.dim() < 2:
            return
        if str(mask.dtype) != "torch.bool" or not broadcasts_to(mask.shape, tuple(x.shape)):
            return
        if _builds_a_mask(call, x):
            return
        if readable(mask):
            effect = fill_effect(fill, x.dtype)
            label = call.label(1, "mask")
            yield MaskUse("masked_fill", label, mask, mask, tuple(x.shape), "fill", effect, x)
    elif op == "where":
        yield from _where_use(call)
    elif op == "add":
        yield from _additive_use(call)
    elif call.spec is _ops.SDPA:
        yield from _sdpa_use(call)
    elif call.spec is _ops.MHA:
        yield from _mha_uses(call)


def _builds_a_mask(call, x) -> bool:
    """masked_fill on a fresh tensor builds a float mask (torch's own _canonical_mask does
    this inside nn.MultiheadAttention); the mask is checked where it is applied."""
    meta = call.meta(x)
    if meta is None and call.module is not None:
        return type(call.module).__module__.startswith("torch.nn")
    if meta is None or meta.role not in (None, "mask"):
        return False
    # Made by a factory (zeros, full, ones_like), or by a cast or copy of one.
    made_by = _ops.lookup(meta.op)
    return made_by.family == _ops.FACTORY or (made_by.family == _ops.SAME and made_by.keeps_value)


def _where_use(call):
    parts = where_arguments(call)
    if not all(name in parts for name in ("condition", "input", "other")):
        return
    (cond, label), (a, _), (b, _) = parts["condition"], parts["input"], parts["other"]
    if not hasattr(cond, "dtype") or str(cond.dtype) != "torch.bool":
        return
    values = [(a, scalar_of(a)), (b, scalar_of(b))]
    scores = [v for v, s in values if is_tensor(v) and s is None]
    if len(scores) != 1 or scores[0].dim() < 2 or not readable(cond):
        return
    target = tuple(scores[0].shape)
    if not broadcasts_to(cond.shape, target):
        return
    if values[1][1] is not None and values[1][1] <= HIDING:
        hidden, fill, kind = ~cond, b, "where"
    elif values[0][1] is not None and values[0][1] <= HIDING:
        hidden, fill, kind = cond, a, "where_fill"
    else:
        return
    # Not None: the branch that chose `fill` compared this scalar with HIDING.
    effect = fill_effect(cast(float, scalar_of(fill)), result_type(scores[0], fill))
    yield MaskUse("torch.where", label, cond, hidden, target, kind, effect, scores[0])


def _additive_use(call):
    args = call.args
    if len(args) < 2 or not (hasattr(args[0], "dtype") and hasattr(args[1], "dtype")):
        return
    for scores, mask, index in ((args[0], args[1], 1), (args[1], args[0], 0)):
        # Cheap tests first: this runs on every addition (residuals included).
        if not mask.is_floating_point() or scores.dim() < 2 or mask.dim() < 2:
            continue
        target = tuple(scores.shape)
        if not broadcasts_to(mask.shape, target) or not readable(mask):
            continue
        label = call.label(index, "mask")
        # Read the values only where the sum may be masked scores (this runs on every
        # addition: a residual's values are not read): scores or their weights by data flow,
        # or a tensor named as a mask. `check` judges the axes only where a product tagged
        # them; anything else waits for a softmax.
        roles = (call.role(mask, label), call.role(scores, call.label(1 - index, "scores")))
        if roles[0] != "mask" and roles[1] not in ("scores", "attn"):
            continue
        hidden = mask <= HIDING
        # An additive mask is 0 where a key is kept; anything else is a bias (ALiBi, ...).
        if not bool(((mask == 0) | hidden).all()):
            continue
        effect = additive_effect(scores, mask, target)
        yield MaskUse("scores + mask", label, mask, hidden, target, "add", effect, scores)
        return


def _sdpa_use(call):
    names = ("query", "key", "value", "attn_mask")
    p = dict(zip(names, call.args, strict=False))
    p.update({k: v for k, v in call.kwargs.items() if k in names})
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    if not (has_shape(q) and has_shape(k) and has_shape(mask)):
        return
    if q.dim() < 2 or not readable(mask):
        return
    target = (*q.shape[:-1], k.shape[-2])
    if not broadcasts_to(mask.shape, target) or call.kwargs.get("is_causal"):
        return
    label = call.label(3, "attn_mask") if len(call.args) > 3 else "attn_mask"
    op = "scaled_dot_product_attention"
    sides = (q, k, -2)
    if str(mask.dtype) == "torch.bool":
        yield MaskUse(
            op, label, mask, ~mask, target, "keep", lambda rows: SDPA_TEXTS.nan, None, sides
        )
    elif mask.is_floating_point():
        effect = values_effect(mask, target, sdpa_dtype(q.dtype), SDPA_TEXTS)
        yield MaskUse(op, label, mask, mask <= HIDING, target, "add", effect, None, sides)


def _mha_uses(call):
    p = bind_arguments(call)
    query, key, heads = p.get("query"), p.get("key"), p.get("num_heads")
    if not (has_shape(query) and has_shape(key) and isinstance(heads, int)):
        return
    if query.dim() != 3 or key.dim() != 3 or p.get("bias_k") is not None or p.get("add_zero_attn"):
        return
    tgt, batch, src = int(query.shape[0]), int(query.shape[1]), int(key.shape[0])
    target = (batch, heads, tgt, src)
    hidden = None
    # The masks the op adds to the scores (it turns bool ones into -inf).
    values: list[torch.Tensor] = []
    # Read only when rows are reported, after both masks are in `values`; only the
    # combined use reports rows (see _findings).
    effect = mha_effect(values, target, query.dtype, p.get("need_weights", True))
    am, kpm = p.get("attn_mask"), p.get("key_padding_mask")
    if has_shape(am) and readable(am):
        h = am if str(am.dtype) == "torch.bool" else am <= HIDING
        if am.dim() == 3 and tuple(am.shape) == (batch * heads, tgt, src):
            h = h.reshape(batch, heads, tgt, src)
        elif tuple(am.shape) != (tgt, src):
            return  # the mha family reports the shape
        yield MaskUse("MultiheadAttention", "attn_mask", am, aligned(h, 4), target, "hide", effect)
        hidden = aligned(h, 4)
        values.append(aligned(am.reshape(h.shape), 4))
    if has_shape(kpm) and readable(kpm):
        if tuple(kpm.shape) != (batch, src):
            return
        h = (kpm if str(kpm.dtype) == "torch.bool" else kpm <= HIDING)[:, None, None, :]
        yield MaskUse("MultiheadAttention", "key_padding_mask", kpm, h, target, "hide", effect)
        hidden = h if hidden is None else hidden | h
        values.append(kpm[:, None, None, :])
    if hidden is not None:
        # Rows the two masks hide together.
        yield MaskUse(
            "MultiheadAttention",
            "attn_mask | key_padding_mask",
            None,
            hidden,
            target,
            "combined",
            effect,
            None,
            (query, key, 0),  # [seq, batch, embed]: the functional form is sequence first
        )


def mask_operands(call, use: MaskUse):
    return (call.operand(use.label, use.mask),) if use.mask is not None else ()
