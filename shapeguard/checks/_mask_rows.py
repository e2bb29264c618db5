"""Rows that hide every key although their query is a real token, and examples that
hide every key from every query, for `mask_semantics`; the rows of padded queries
are left alone."""

from .._errors import Violation
from ._mask_uses import MaskUse, mask_operands
from ._own_keys import own_keys

_READS = {
    "keep": "SDPA keeps the keys where a bool attn_mask is True",
    "hide": "nn.MultiheadAttention hides the keys where a bool mask is True",
    "fill": "masked_fill hides where the mask is True",
    "where": "torch.where keeps the scores where the condition is True",
    "where_fill": "torch.where puts the fill where the condition is True",
    "add": "an additive mask is 0 where a key is kept and very negative where it is hidden",
    "combined": "nn.MultiheadAttention hides the keys where attn_mask or key_padding_mask "
    "is True, or -inf in a float mask",
}


def fully_masked(call, use: MaskUse, hidden) -> Violation | None:
    """Rows that hide every key, where that is a bug: the query is a real token, or its
    whole (example, head) slice sees nothing (an empty sequence in the batch)."""
    full = all_hidden(hidden, -1)  # [..., 1 or seq_q]
    if not bool(full.any()):
        return None
    empty = full.all(-1, keepdim=True)  # slices where no query sees any key
    real = full & ~_padded_queries(hidden, use.target, _own_keys_of(call, use))
    rows = (real | empty).expand(*use.target[:-1])
    if not bool(rows.any()):
        return None  # only padded queries: the layout of left (and some right) padding
    count, total = int(rows.sum()), rows.numel()
    first = [int(i) for i in rows.nonzero()[0]]
    names = ("batch", "heads", "query")[-len(first) :] if len(first) <= 3 else None
    at = ", ".join(f"{n} {i}" for n, i in zip(names, first, strict=True)) if names else str(first)
    reads = _READS[use.kind]
    if bool((real & ~empty).any()):
        # Other queries see these rows' own positions as keys: the mask treats them as real
        # tokens. They may be real queries left with nothing (a shifted triangle, a flipped
        # mask), or padding hidden on the query axis only (hyunwoongko's [batch, 1, seq, 1]
        # with left padding): the hint names both, and claims neither.
        hint = (
            "each query must see at least one key, and other queries see these rows' own "
            "positions as keys, so the mask treats them as real tokens: if they are padding, "
            "hide them as keys too (padding goes on the key axis, [batch, 1, 1, seq_k]); else "
            f"check the mask's polarity ({reads}) and that a causal mask hides only the keys "
            "after each query, never its own"
        )
        if bool(empty.any()):
            hint += "; an example whose queries see no key at all is empty: drop it from the batch"
    else:
        hint = (
            "each query must see at least one key: an example whose queries see no key is all "
            f"padding (drop it from the batch) or its mask has the wrong polarity ({reads})"
        )
    return Violation(
        "mask_fully_masked",
        f"{use.op}: {use.label} hides every key from {count} of {total} query rows "
        f"(first at {at}): {use.effect(rows)}",
        mask_operands(call, use),
        hint,
        severity="warning",
    )


def all_hidden(hidden, dim: int):
    """`hidden.all(dim)` for a bool tensor, as the minimum of its bytes: about 13x faster
    on CPU (torch 2.13, a [8, 1, 2048, 2048] mask: 2.7 ms instead of 35 ms), and this runs
    on every layer of a padded batch."""
    import torch

    if hidden.dtype != torch.bool or hidden.shape[dim] == 0:
        return hidden.all(dim)
    return hidden.view(torch.uint8).amin(dim).bool()


def _own_keys_of(call, use: MaskUse) -> list[int] | None:
    """Which key is each query's own position, read from the axes of the scores (or of
    SDPA's and nn.MultiheadAttention's query and key); None where structure does not say."""
    sq, sk = use.target[-2:]
    if use.scores is not None:
        meta = call.meta(use.scores)
        if meta is None or len(meta.dims) != use.scores.dim():
            return None
        return own_keys(meta.dims[-2], meta.dims[-1], sq, sk)
    if use.operands is None:
        return None
    query, key, at = use.operands
    if _same_view(query, key):
        return list(range(sq)) if sq == sk else None
    q_meta, k_meta = call.meta(query), call.meta(key)
    if q_meta is None or k_meta is None:
        return None
    if len(q_meta.dims) != query.dim() or len(k_meta.dims) != key.dim():
        return None
    return own_keys(q_meta.dims[at], k_meta.dims[at], sq, sk)


def _same_view(a, b) -> bool:
    """One tensor, or two views of one in the same layout: nn.MultiheadAttention's
    self-attention (query = key = value), transposed for the functional form."""
    if a is b:
        return True
    base = getattr(a, "_base", None)
    return (
        base is not None
        and base is getattr(b, "_base", None)
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _padded_queries(hidden, target, own: list[int] | None):
    """Where query i is padding: its own key (`own[i]`) is hidden from every query of its
    slice, as in left-padded decoders and in encoders that hide padded query rows too.
    [..., seq_q]. Where structure does not say which key is a query's own position
    (cross-attention, keys that are segment means, a cache joined by concatenation), or a
    query's position is not among the keys, nothing tells it from padding: all True, so
    only slices whose queries all see nothing are reported. All False where the mask is
    broadcast over the queries or the keys and so cannot tell."""
    import torch

    sq, sk = target[-2:]
    if tuple(hidden.shape[-2:]) != (sq, sk):
        return torch.zeros((), dtype=torch.bool)
    if own is None:
        return torch.ones((), dtype=torch.bool)
    unseen = all_hidden(hidden, -2)  # [..., seq_k]: keys that no query of the slice sees
    index = torch.tensor(own, dtype=torch.long)
    return unseen[..., index.clamp(min=0)] | (index < 0)
