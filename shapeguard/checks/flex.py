"""torch's FlexAttention: a BlockMask checked against the q and k it is applied to, before
the call runs (torch's kernels index the mask by q's batch, head and block: a mask made
for other sizes reads other rows, or past its end, pytorch#172225), and a mask shared
over the batch or heads whose `mask_mod` needs other blocks for another example or head
(the mod evaluated on the traced sizes, `_reach/block_mask.py`). The call's reach is
recorded and judged by `reach.attention_reach` (read by `_fused_reach`).

The call reaches this family only through the wrapper a trace puts on
`torch.nn.attention.flex_attention.flex_attention` (`_trace/torch_entries.py`): no
TorchFunctionMode sees it, since it runs its higher-order op compiled.
"""

import math
from collections.abc import Iterator

from .. import _ops
from .._errors import Operand, Violation
from .._reach import block_mask
from .._values import is_tensor
from . import ERROR, WARNING, rule
from ._fused_reach import is_flex
from ._view import CallView

_KINDS = {"block_mask_shape": ERROR, "block_mask_broadcast": WARNING}
# torch's BlockMask for "no mask" (`_create_empty_block_mask`): it fits every length.
_NO_MASK_BLOCK = 1 << 30


@rule(_ops.FLEX, kinds=_KINDS)
def block_mask_fits(call: CallView) -> Iterator[Violation]:
    if not is_flex(call.func):
        return
    bound = call.bound()
    q, k, mask = bound.get("query"), bound.get("key"), bound.get("block_mask")
    if not (is_tensor(q) and is_tensor(k)) or q.dim() != 4 or k.dim() != 4:
        return  # torch's own checks say it
    if mask is None or not hasattr(mask, "kv_num_blocks"):
        return
    q_name, k_name = _label(call, q, 0, "query"), _label(call, k, 1, "key")
    operands = (
        call.operand(q_name, q),
        call.operand(k_name, k),
        Operand(_label(call, mask, 4, "block_mask"), _mask_text(mask)),
    )
    found = list(_shape_problems(q, k, mask, q_name, k_name))
    for relation, hint in found:
        yield Violation("block_mask_shape", relation, operands, hint)
    if found:
        return
    yield from _broadcasts(call, q, mask, operands)


def _label(call: CallView, value, index: int, param: str) -> str:
    """The user's expression for argument `param` (positional `index`), else its name."""
    if index < len(call.args) and call.args[index] is value:
        return call.label(index, param)
    return call.label_of(value, param) if is_tensor(value) else param


def _mask_text(mask) -> str:
    b, h = (int(s) for s in mask.kv_num_blocks.shape[:2])
    sq, sk = (int(s) for s in mask.seq_lengths)
    bq, bk = (int(s) for s in mask.BLOCK_SIZE)
    return f"[batch={b}, heads={h}, seq_q={sq}, seq_k={sk}] in blocks of {bq} x {bk}"


def _shape_problems(q, k, mask, q_name: str, k_name: str) -> Iterator[tuple[str, str]]:
    """(relation, hint) for each size of `mask` that does not fit q and k, as torch's
    kernels read it: seq_lengths, then the blocks, then batch and heads."""
    B, H, sq, _ = (int(s) for s in q.shape)  # noqa: N806 (flex_attention's own names)
    sk = int(k.shape[-2])
    mask_b, mask_h = (int(s) for s in mask.kv_num_blocks.shape[:2])
    mq, mk = (int(s) for s in mask.seq_lengths)
    block_q, block_k = (int(s) for s in mask.BLOCK_SIZE)
    new = f"make it for these sizes: create_block_mask(mask_mod, B, H, {sq}, {sk})"
    if block_q != _NO_MASK_BLOCK or block_k != _NO_MASK_BLOCK:
        if (mq, mk) != (sq, sk):
            relation = (
                f"flex_attention: block_mask was made for seq_q={mq}, seq_k={mk} (its "
                f"seq_lengths), but {q_name} has seq_q={sq} and {k_name} seq_k={sk}"
            )
            if sq <= mq and sk <= mk:
                hint = (
                    f"{new}; or crop it with block_mask._adjust({sq}, {sk}), which keeps "
                    "its upper-left corner: wrong for masks aligned to the end (a causal "
                    "mask over a cache)"
                )
            else:
                hint = f"it was made for shorter sequences: {new}"
            yield relation, hint
            return
        have_q, have_k = int(mask.kv_num_blocks.shape[-1]), int(mask.kv_indices.shape[-1])
        need_q, need_k = math.ceil(sq / block_q), math.ceil(sk / block_k)
        if have_q < need_q or have_k < need_k:
            yield (
                f"flex_attention: block_mask holds {have_q} query blocks x {have_k} key "
                f"blocks of {block_q} x {block_k}, but seq_q={sq}, seq_k={sk} need "
                f"{need_q} x {need_k}",
                f"its blocks were made for shorter sequences (seq_lengths says otherwise): {new}",
            )
            return
    for axis, have, want, param in (("batch", mask_b, B, "B"), ("heads", mask_h, H, "H")):
        if have not in (1, want):
            yield (
                f"flex_attention: block_mask has {axis}={have}, {q_name} has {axis}={want} "
                "(a BlockMask's batch and heads are 1, broadcast, or the query's)",
                f"create_block_mask(mask_mod, {param}={want}, ...) for this query, or "
                f"{param}=None to share one mask over {axis} when the mask_mod does not "
                f"read {'b' if axis == 'batch' else 'h'}",
            )


def _broadcasts(call: CallView, q, mask, operands) -> Iterator[Violation]:
    """A mask made for batch (heads) 1 shared by the query's, whose `mask_mod` needs other
    blocks for another example (head) than the first: a kernel that skips blocks computes
    each with the first one's (torch's eager CPU path applies the mod everywhere and
    hides it). Read by comparing the mod's rows with what the blocks let through."""
    import torch

    B, H, sq, _ = (int(s) for s in q.shape)  # noqa: N806 (flex_attention's own names)
    mask_b, mask_h = (int(s) for s in mask.kv_num_blocks.shape[:2])
    if not ((mask_b == 1 and B > 1) or (mask_h == 1 and H > 1)):
        return
    mod = getattr(mask, "mask_mod", None)
    if mod is None or q.device.type != "cpu":
        return
    with torch.no_grad():
        found = block_mask.visible_of(mod, B, H, sq, int(mask.seq_lengths[1]))
        if found is None:
            return
        visible, queries = found
        wrong = block_mask.kernel_visible(mask, visible, queries) != visible
    if not bool(wrong.any()):
        return
    kept = queries if queries is not None else range(sq)
    axes = (
        ("batch", mask_b, B, "b", "examples", "example"),
        ("heads", mask_h, H, "h", "heads", "head"),
    )
    for axis, (name, have, want, index_name, plural, single) in enumerate(axes):
        if have != 1 or want == 1:
            continue
        # The slices of this axis that differ where the other axis is at its first.
        along = wrong.narrow(1 - axis, 0, 1).flatten(2).any(-1).flatten()
        if not bool(along.any()):
            continue
        first = int(along.nonzero()[0])
        at = wrong.narrow(axis, first, 1).narrow(1 - axis, 0, 1).flatten(0, 1)[0]
        query = kept[int(at.any(-1).nonzero()[0])]
        yield Violation(
            "block_mask_broadcast",
            f"flex_attention: block_mask made for {name}=1 is shared by {name}={want}, but "
            f"its mask_mod reads {index_name}: {int(along.sum())} of {want} {plural} need "
            f"other blocks than {single} 0's (first: {single} {first}, query {query})",
            operands,
            f"create_block_mask(mask_mod, {'B' if axis == 0 else 'H'}={want}, ...): a "
            f"kernel that skips blocks (compiled, on a GPU) computes every {single} with "
            f"{single} 0's blocks; torch's eager CPU path applies the mask_mod everywhere "
            "and hides it",
        )
