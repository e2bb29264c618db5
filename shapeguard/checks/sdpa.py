"""F.scaled_dot_product_attention's documented contract, whatever kernel torch picks.

torch's default CPU kernel accepts k/v of different lengths and a mask together
with is_causal without a word (pytorch#193728); these checks do not depend on
the backend.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from .._names.dims import FEATURE
from .._values import is_tensor
from . import ERROR, rule
from ._view import CallView
from .elementwise import mask_hint

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass

_KINDS = {
    kind: ERROR
    for kind in (
        "sdpa_rank", "sdpa_head_dim", "sdpa_kv_seq", "sdpa_batch", "sdpa_heads", "sdpa_gqa",
        "sdpa_mask_causal", "mask_dtype", "mask_broadcast",
    )
}  # fmt: skip


@rule(_ops.SDPA, kinds=_KINDS)
def sdpa_contract(call: CallView) -> Iterator[Violation]:
    """F.scaled_dot_product_attention's documented contract."""
    p = call.bound()
    q, k, v = p.get("query"), p.get("key"), p.get("value")
    if not (is_tensor(q) and is_tensor(k) and is_tensor(v)):
        return
    names = [call.label(i, default) for i, default in enumerate(("q", "k", "v"))]
    lq, lk, lv = names
    operands = (call.operand(lq, q), call.operand(lk, k), call.operand(lv, v))
    layout = _layout_hint(call, q, k, lq)
    if q.dim() != k.dim() or k.dim() != v.dim() or q.dim() < 2:
        yield Violation(
            "sdpa_rank",
            f"scaled_dot_product_attention: {lq}, {lk}, {lv} have {q.dim()}, {k.dim()}, {v.dim()} axes; "
            "they must all be [batch, heads, seq, d_k]",
            operands,
            "give all three the same layout [batch, heads, seq, d_k]",
        )
        return
    if q.shape[-1] != k.shape[-1]:
        yield Violation(
            "sdpa_head_dim",
            f"scaled_dot_product_attention: {lq}.{call.axis(q, -1)} ({q.shape[-1]}) != "
            f"{lk}.{call.axis(k, -1)} ({k.shape[-1]})",
            operands,
            layout
            or f"{lq} and {lk} must share their head size (the last axis); check the projections",
        )
        return
    if k.shape[-2] != v.shape[-2]:
        yield Violation(
            "sdpa_kv_seq",
            f"scaled_dot_product_attention: {lk}.{call.axis(k, -2)} ({k.shape[-2]}) != "
            f"{lv}.{call.axis(v, -2)} ({v.shape[-2]})",
            operands,
            f"every key needs a value: {lk} and {lv} must have the same sequence length "
            "(torch's default CPU kernel accepts this silently and returns garbage)",
        )
        return
    if q.dim() >= 3:
        batch_q, batch_k, batch_v = (tuple(t.shape[: max(t.dim() - 3, 1)]) for t in (q, k, v))
        if not (batch_q == batch_k == batch_v):
            yield Violation(
                "sdpa_batch",
                f"scaled_dot_product_attention: batch axes differ: {lq} {list(batch_q)}, "
                f"{lk} {list(batch_k)}, {lv} {list(batch_v)}",
                operands,
                layout or "q, k and v must come from the same batch",
            )
            return
    if q.dim() >= 4:
        yield from _check_heads(call, p, q, k, v, names, operands, layout)
    yield from _check_mask(call, p, q, k, lq)


def _layout_hint(call, q, k, lq: str) -> str:
    """A hint when q is in flash-attn's [batch, seq, heads, d_k] layout: axis 2 a factor
    of a projection's features (by its parameters, not its size) as long as the module's
    declared head count, axis 1 not one."""
    if q.dim() != 4:
        return ""
    heads = call.declared().get("heads")
    if heads is None or q.shape[2] != heads[1] or q.shape[1] == heads[1]:
        return ""
    if call.kind(q, 2, strong=True) == FEATURE and call.kind(q, 1, strong=True) != FEATURE:
        return (
            f"{lq} looks like [batch, seq, heads, d_k] (heads={heads[1]} on axis 2); SDPA wants "
            f"[batch, heads, seq, d_k]: pass {lq}.transpose(1, 2) (and the same for k and v)"
        )
    return ""


def _check_heads(call, p, q, k, v, names, operands, layout):
    lq, lk, lv = names
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    gqa = bool(p.get("enable_gqa", False))
    if hk != hv:
        yield Violation(
            "sdpa_heads",
            f"scaled_dot_product_attention: {lk}.heads ({hk}) != {lv}.heads ({hv})",
            operands,
            layout or "k and v must have the same number of heads",
        )
        return
    if hq == hk:
        return
    if not gqa:
        hint = layout or (
            f"{hq} query heads and {hk} kv heads: for grouped-query attention pass enable_gqa=True, "
            f"or repeat k and v with repeat_interleave({hq // hk}, dim=-3)"
            if hq % hk == 0
            else f"{lq} and {lk} must have the same number of heads"
        )
        yield Violation(
            "sdpa_heads",
            f"scaled_dot_product_attention: {lq}.heads ({hq}) != {lk}.heads ({hk}) and enable_gqa is off",
            operands,
            hint,
        )
    elif hq % hk:
        yield Violation(
            "sdpa_gqa",
            f"scaled_dot_product_attention: {lq}.heads ({hq}) is not a multiple of {lk}.heads ({hk})",
            operands,
            f"grouped-query attention shares each kv head among {lq}.heads / {lk}.heads query "
            f"heads; kv head counts that work: {', '.join(map(str, _axes.divisors(hq)))}",
        )


def _check_mask(call, p, q, k, lq):
    mask = p.get("attn_mask")
    if mask is None or not is_tensor(mask):
        return
    lm = call.label(3, "attn_mask") if len(call.args) > 3 else "attn_mask"
    if p.get("is_causal"):
        yield Violation(
            "sdpa_mask_causal",
            "scaled_dot_product_attention: attn_mask and is_causal=True are both set",
            (call.operand(lm, mask),),
            "pass one: is_causal=True alone, or fold causality into attn_mask "
            "(torch's default CPU kernel ignores this silently)",
        )
        return
    dtype = str(mask.dtype)
    if dtype != "torch.bool" and mask.dtype != q.dtype:
        kind_hint = (
            f"{lm}.bool() with True where attention is allowed"
            if not mask.is_floating_point()
            else f"{lm}.to({lq}.dtype)"
        )
        yield Violation(
            "mask_dtype",
            f"scaled_dot_product_attention: {lm} is {dtype.removeprefix('torch.')}; SDPA wants bool "
            f"(True = attend) or {str(q.dtype).removeprefix('torch.')} (added to the scores)",
            (call.operand(lm, mask), call.operand(lq, q)),
            f"use {kind_hint}",
        )
        return
    target = (*q.shape[:-1], k.shape[-2])
    result = _axes.broadcast_shapes(tuple(mask.shape), target)
    if result != target:
        names = ("batch", "heads", "seq_q", "seq_k")[-len(target) :] if len(target) <= 4 else None
        spelled = (
            ", ".join(f"{n}={s}" for n, s in zip(names, target, strict=True))
            if names
            else ", ".join(map(str, target))
        )
        yield Violation(
            "mask_broadcast",
            f"scaled_dot_product_attention: {lm} {list(mask.shape)} does not broadcast to "
            f"[{spelled}]",
            (call.operand(lm, mask), call.operand(lq, q)),
            mask_hint(call, mask, lm, target)
            or "attn_mask must broadcast to [batch, heads, seq_q, seq_k]",
        )
