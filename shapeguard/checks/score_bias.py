"""A bias on attention scores that is constant along the keys does nothing.

softmax over the keys is unchanged when each row gets a constant added: an ALiBi or
relative-position bias laid out `[heads, seq_q, 1]` (per query) instead of
`[heads, 1, seq_k]` or `[heads, seq_q, seq_k]` is cancelled, and the model trains
without its positions. Found where the bias meets the scores: `scores + bias`,
the `input` of `baddbmm` (BLOOM), and a float `attn_mask` of SDPA whose finite
part is constant along the keys (a bias summed with a causal mask).
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _ops
from .._errors import Violation
from .._names.flow import classify_product
from .._values import is_tensor
from . import WARNING, rule
from ._view import CallView

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass

# At or below this an additive value hides a key (-1e9, finfo.min, -inf): a mask, not a bias.
_HIDING = -1e4
_MAX_VALUES = 1 << 22


def _readable(t) -> bool:
    return (
        type(t).__name__ in ("Tensor", "Parameter", "Buffer")
        and t.device.type == "cpu"
        and t.numel() <= _MAX_VALUES
    )


def _a_bias(t) -> bool:
    """Finite values that are not all zero: a bias, not a mask (0 where kept, very
    negative where hidden). Read only from small CPU tensors."""
    import torch

    if not t.is_floating_point() or not _readable(t):
        return False
    with torch.no_grad():
        finite = t[t > _HIDING]
        return bool(finite.numel()) and bool((finite != 0).any())


def _key_axis(call, scores) -> int | None:
    """The axis of the keys in a scores tensor, as the query-key product that made it
    tagged it; None when the tensor is not scores or no product named its keys."""
    meta = call.meta(scores)
    if meta is None or meta.role != "scores" or scores.dim() < 2 or "k" not in meta.tags:
        return None
    return meta.tags.index("k") - scores.dim()


def _constant_along(bias, target_shape: tuple, key: int) -> bool:
    """`bias`, aligned right to `target_shape`, has one entry along axis `key`, more than
    one along some other axis (a layout, not a scalar), and the scores have more than one
    key there (along one key, every bias is constant)."""
    ndim = len(target_shape)
    if int(target_shape[key]) < 2:
        return False
    lead = ndim - bias.dim()
    k = ndim + key - lead
    along = bias.shape[k] if 0 <= k < bias.dim() else 1
    return along == 1 and any(int(s) > 1 for s in bias.shape)


def _violation(
    call, where: str, label: str, bias, scores_shape, key: int, *, masked=False, scores=None
) -> Violation:
    ndim = len(scores_shape)
    sq, sk = scores_shape[key - 1], scores_shape[key]
    what = (
        f"{label} {list(bias.shape)} adds one value per query row to the keys it keeps (its "
        "bias is constant along seq_k)"
        if masked
        else f"{label} {list(bias.shape)} is constant along seq_k (one value for all {sk} keys "
        "of a query)"
    )
    return Violation(
        "score_bias_constant",
        f"{where}: {what}: softmax over the keys cancels it, so it has no effect",
        (call.operand(label, bias, like=scores), *_scores_operand(call, scores)),
        f"lay the bias out along the keys: [.., 1, seq_k] for a bias per key, or "
        f"[.., seq_q, seq_k] = [.., {sq}, {sk}] for one that depends on both (ALiBi: "
        "-slope * (i - j)); "
        f"a [.., seq_q, 1] bias only shifts each row of the {ndim}-D scores",
        severity="warning",
    )


def _scores_operand(call, scores) -> tuple:
    if scores is None:
        return ()
    return (call.operand(call.label_of(scores, "scores"), scores),)


@rule(_ops.by_name("add"), kinds={"score_bias_constant": WARNING}, order=1, operands=2)
def added_to_scores(call: CallView) -> Iterator[Violation]:
    args = call.args
    if len(args) < 2 or not (is_tensor(args[0]) and is_tensor(args[1])):
        return
    for scores, bias, index in ((args[0], args[1], 1), (args[1], args[0], 0)):
        key = _key_axis(call, scores)
        if key is None or bias.dim() > scores.dim():
            continue
        if _constant_along(bias, tuple(scores.shape), key) and _a_bias(bias):
            where = f"{call.label(1 - index, 'scores')} + {call.label(index, 'bias')}"
            yield _violation(
                call,
                where,
                call.label(index, "bias"),
                bias,
                tuple(scores.shape),
                key,
                scores=scores,
            )
            return


@rule(_ops.by_name("baddbmm"), kinds={"score_bias_constant": WARNING}, order=1)
def baddbmm_input(call: CallView) -> Iterator[Violation]:
    p = call.bound()
    base, b1, b2 = p.get("input"), p.get("batch1"), p.get("batch2")
    if not (is_tensor(b1) and b1.dim() == 3 and is_tensor(b2) and b2.dim() == 3):
        return
    if not is_tensor(base):
        return
    m1, m2 = call.meta_of(b1), call.meta_of(b2)
    d1, d2 = m1.dims, m2.dims
    if classify_product(call, b1, b2, m1, m2, d1[-1], d2[-2], d1[-2], d2[-1]) != "scores":
        return
    shape = (int(b1.shape[0]), int(b1.shape[1]), int(b2.shape[2]))
    if _constant_along(base, shape, -1) and _a_bias(base):
        label = call.label(0, "input") if call.args else "input"
        yield _violation(call, "baddbmm", label, base, shape, -1)


@rule(_ops.SDPA, kinds={"score_bias_constant": WARNING}, order=1)
def sdpa_bias(call: CallView) -> Iterator[Violation]:
    """A float attn_mask whose finite part is constant along each row of keys but not the
    same for every row: a bias laid out per query, summed with a mask or alone."""
    import torch

    p = call.bound()
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    if not (is_tensor(q) and is_tensor(k) and is_tensor(mask)) or not mask.is_floating_point():
        return
    if not _readable(mask) or mask.dim() < 2 or q.dim() < 2:
        return
    target = (*q.shape[:-1], k.shape[-2])
    if int(target[-1]) < 2:
        return  # one key: any bias is constant along it, and the mask rules judge the rest
    label = call.label(3, "attn_mask") if len(call.args) > 3 else "attn_mask"
    if _constant_along(mask, target, -1):
        if _a_bias(mask):
            yield _violation(call, "scaled_dot_product_attention", label, mask, target, -1)
        return
    with torch.no_grad():
        kept = mask > _HIDING
        rows = mask.reshape(-1, mask.shape[-1])
        kept = kept.reshape(-1, mask.shape[-1])
        seen = kept.any(-1)  # rows that hide every key are the mask rules' concern
        rows, kept = rows[seen], kept[seen]
        if not rows.numel():
            return
        high = torch.where(kept, rows, torch.full_like(rows, -float("inf"))).amax(-1)
        low = torch.where(kept, rows, torch.full_like(rows, float("inf"))).amin(-1)
        per_row_constant = bool((high == low).all())
        varies = bool((high != high[0]).any())
    if per_row_constant and varies:
        yield _violation(call, "scaled_dot_product_attention", label, mask, target, -1, masked=True)
