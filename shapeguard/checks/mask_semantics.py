"""Masks that broadcast and still hide the wrong positions.

Every way of masking scores (masked_fill with a large negative value, where with
one, an additive float mask, SDPA's attn_mask, nn.MultiheadAttention's attn_mask
and key_padding_mask) is reduced to one boolean tensor, `hidden`, True where a
key is hidden from a query, aligned to the scores `[..., seq_q, seq_k]`. The
rules read that tensor's pattern:

- polarity: the inverse of a causal triangle, or a padding mask that hides the
  real tokens (some row hides every key) -- True meant "keep" where the op reads
  "hide", or the reverse;
- direction: a triangle that hides the past instead of the future;
- role: a `[batch, seq]` padding mask that lines up with `[seq_q, seq_k]` only
  because batch == seq_q, or a mask that varies along the queries only;
- rows that hide every key although their query is a real token, and examples
  that hide every key from every query (an empty sequence); the rows of padded
  queries, whose own key no query sees, are how left-padded decoders and some
  encoders mask, and are left alone. Which key is a query's own, the axes'
  identities say (`_own_keys`), never their sizes; where they do not (cross-
  attention, landmark keys), only empty examples are reported. The message says
  what the op returns there, read from the fill value (or the mask's values) and
  the dtype;
- a causal buffer used whole, which fits only one sequence length;
- SDPA's is_causal with seq_q != seq_k, which aligns the triangle top-left.

Values are read only from small CPU tensors (never on meta), and messages give
positions and counts, never values.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names.flow.waiting import read_along
from . import WARNING, rule
from ._mask_effects import aligned, has_shape
from ._mask_patterns import (
    among_real,
    batch_as_query,
    padding_polarity,
    query_axis,
    triangle,
    triangle_violation,
    unsliced_buffer,
)
from ._mask_rows import fully_masked
from ._mask_uses import MaskUse, mask_uses
from ._view import CallView
from .elementwise import wait_for_softmax

# The ops that apply a mask to scores (the probes watch them too).
MASKING = (
    _ops.by_name("masked_fill"),
    _ops.by_name("where"),
    _ops.by_name("add"),
    _ops.SDPA,
    _ops.MHA,
)
_SOFTMAXES = (_ops.by_name("softmax"), _ops.by_name("log_softmax"))
_MASK_KINDS = {
    kind: WARNING
    for kind in (
        "mask_polarity", "mask_direction", "mask_axis", "mask_fully_masked",
        "causal_buffer_unsliced", "causal_alignment",
    )
}  # fmt: skip


@rule(*(op for op in MASKING if op.name != "add"), kinds=_MASK_KINDS, order=2)
def check(call: CallView) -> Iterator[Violation]:
    """What a mask hides, read from its values: polarity, direction, axis, empty rows.

    SDPA and nn.MultiheadAttention say by their arguments which axes are the queries and
    the keys, and their own softmax reads the mask: everything is reported there. A mask
    applied to a tensor by masked_fill, where or an addition is judged on the tensor's
    last two axes only where a query-key product made them the queries and the keys
    (its tags); rows hidden whole are a claim about a softmax, so that finding waits for
    the softmax that reads the tensor over its last axis (`_names.flow.waiting`), and so
    does every finding on a tensor whose axes no product named."""
    import torch

    with torch.no_grad():
        found = False
        waits: list[Violation] = []
        for use in mask_uses(call):
            if use.kind == "combined" and found:
                break  # the rows are empty because of what was reported already
            known = use.scores is None or _axes_known(call, use.scores)
            patterns, rows = _findings(call, use, known)
            if use.scores is None:
                for violation in (*patterns, *([rows] if rows is not None else [])):
                    found = True
                    yield violation
                continue
            if known:
                for violation in patterns:
                    found = True
                    yield violation
            else:
                waits.extend(patterns)
            if rows is not None:
                waits.append(rows)
            if waits:
                # One use per op that masks a tensor (masked_fill, where, an addition).
                wait_for_softmax(call, waits, use.target)
                break
        if call.spec is _ops.SDPA:
            yield from _check_is_causal(call)


@rule(_ops.by_name("add"), kinds=_MASK_KINDS, order=2, operands=2)
def added_mask(call):
    """A mask added to the scores: `check`, on additions of two tensors only."""
    yield from check(call)


@rule(*_SOFTMAXES, kinds={**_MASK_KINDS, "mask_dtype": WARNING}, order=2)
def read_by_softmax(call: CallView) -> Iterator[Violation]:
    """The findings that waited for a softmax over the last axis of the masked tensor
    (`check`, `elementwise.bool_mask_added`): this softmax makes them true."""
    p = call.bound()
    x, dim = p.get("input"), p.get("dim")
    if not has_shape(x) or not isinstance(dim, int) or isinstance(dim, bool):
        return
    waiting = read_along(x, dim)
    if waiting is not None:
        yield from waiting.findings


def _axes_known(call, scores) -> bool:
    """The last two axes of `scores` are the queries and the keys by structure: a
    query-key product tagged them so, and the ops since kept the tags."""
    meta = call.meta(scores)
    if meta is None:
        return False
    tags = meta.tags
    return len(tags) == scores.dim() >= 2 and tags[-2] == "q" and tags[-1] == "k"


# -- the rules -------------------------------------------------------------------------
def _findings(call, use: MaskUse, query_known: bool) -> tuple[list[Violation], Violation | None]:
    """What the mask's pattern says (polarity, direction, axis, a causal buffer used
    whole), and rows it hides whole (None when none, or when a pattern explains them).
    Without the queries' axis known, only what needs no more than the key axis."""
    hidden = aligned(use.hidden, len(use.target))
    if hidden.dim() != len(use.target) or len(use.target) < 2:
        return [], None
    if use.kind == "combined":
        return [], fully_masked(call, use, hidden)
    patterns: list[Violation] = []
    readings: tuple = (padding_polarity,)
    if query_known:
        sq, sk = use.target[-2:]
        hq, hk = hidden.shape[-2:]
        square = (hq, hk) == (sq, sk) and sq > 1 and sk > 1
        shape = triangle(hidden) if square else None
        if square and shape is None:
            # A causal mask ANDed with padding is judged by what the real queries see of
            # the real keys: a swapped triangle is that bug, whatever rows padding empties.
            among = among_real(hidden)
            shape = among if among in ("inverse", "past") else None
        buffer = unsliced_buffer(call, use, shape)
        if buffer is not None:
            patterns.append(buffer)
        if shape in ("inverse", "past"):
            patterns.append(triangle_violation(call, use, shape))
            return patterns, None
        if shape == "causal":
            return patterns, None
        readings = (padding_polarity, batch_as_query, query_axis)
    for reading in readings:
        violation = reading(call, use, hidden)
        if violation is not None:
            patterns.append(violation)
            return patterns, None
    if not query_known or (use.kind in ("hide", "keep") and use.op == "MultiheadAttention"):
        return patterns, None  # the combined use reports rows of nn.MultiheadAttention
    return patterns, fully_masked(call, use, hidden)


def _check_is_causal(call):
    """is_causal=True aligns the triangle top-left: with a cache (seq_q < seq_k) the new
    queries, which are the last positions, see only the first keys."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    p = dict(zip(names, call.args, strict=False))
    p.update({k: v for k, v in call.kwargs.items() if k in names})
    q, k = p.get("query"), p.get("key")
    if p.get("is_causal") is not True or p.get("attn_mask") is not None:
        return
    if not (has_shape(q) and has_shape(k)) or q.dim() < 2:
        return
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    if sq >= sk:
        return
    lq = call.label(0, "q")
    yield Violation(
        "causal_alignment",
        f"scaled_dot_product_attention(is_causal=True) with seq_q={sq} < seq_k={sk}: the "
        f"causal triangle is aligned top-left, so query i sees keys 0..i only, not the "
        f"{sk - sq} cached keys before it",
        (call.operand(lq, q), call.operand(call.label(1, "k"), k)),
        f"pass an explicit mask aligned bottom-right, attn_mask=torch.ones({sq}, {sk}, "
        f"dtype=torch.bool).tril({sk - sq}), and is_causal=False",
        severity="warning",
    )
