"""The reach of a FlexAttention call: its BlockMask's `mask_mod` (and its `score_mod`'s
-inf) evaluated on the index grid of the traced sizes, as torch's `create_mask` evaluates it (b, h, q_idx, kv_idx
under vmap), on sampled query rows and one example at a time, so the cost is bounded:
at most `MAX_CELLS` cells per evaluation and `rows.MAX_ROWS` stored rows.

Every example and head is evaluated: whether the mod reads `b` or `h` is read from its
effect (`Reach` keeps an axis at 1 where every slice is alike), never from its code.
"""

from typing import TYPE_CHECKING

from .rows import MAX_QUERIES, MAX_ROWS, MIN_QUERIES, Reach, sampled_queries

if TYPE_CHECKING:
    import torch

# Cells of one evaluation (heads x kept queries x keys): the mod's intermediates are this
# size (int64 indices: 8 bytes a cell, 32 MiB at the bound).
MAX_CELLS = 1 << 22


def kept_queries(batch: int, heads: int, seq_q: int, seq_k: int) -> tuple[int, ...] | None:
    """The queries to evaluate (None: all), or () where even `MIN_QUERIES` per slice is
    past the bounds (then no reach is read)."""
    limit = min(MAX_QUERIES, MAX_ROWS // max(batch * heads, 1), MAX_CELLS // (heads * seq_k))
    if limit < MIN_QUERIES:
        return ()
    return sampled_queries(seq_q, limit)


def visible_of(
    mask_mod, batch: int, heads: int, seq_q: int, seq_k: int, score_mod=None
) -> tuple["torch.Tensor", tuple[int, ...] | None] | None:
    """The bool `[batch, heads, kept queries, seq_k]` of `mask_mod` (None: every key) and
    of `score_mod` (a key it sets to -inf for a score of 0 is hidden, as `create_mask`
    reads a score_mod), and the kept queries; or None where it is past the bounds or a
    mod cannot be evaluated on CPU index grids (it reads tensors on another device, or
    fails: torch will say so when it runs). Nothing is claimed then: a reach without the
    score_mod's -inf could see keys that the model hides."""
    import torch
    from torch.nn.attention.flex_attention import create_mask

    queries = kept_queries(batch, heads, seq_q, seq_k)
    if queries == ():
        return None
    rows = torch.arange(seq_q) if queries is None else torch.tensor(queries)

    def masking(first: int):
        def mod(b, h, q_idx, kv_idx):
            return mask_mod(b + first, h, rows[q_idx], kv_idx)

        return mod

    def scoring(first: int):
        def mod(score, b, h, q_idx, kv_idx):
            return score_mod(score, b + first, h, rows[q_idx], kv_idx)

        return mod

    slices = []
    try:
        for example in range(batch):
            seen = torch.ones(1, heads, len(rows), seq_k, dtype=torch.bool)
            if mask_mod is not None:
                seen &= create_mask(masking(example), 1, heads, len(rows), seq_k, "cpu")
            if score_mod is not None:
                seen &= create_mask(scoring(example), 1, heads, len(rows), seq_k, "cpu")
            slices.append(seen)
    except Exception:  # the user's mod: no claim where it cannot be evaluated here
        return None
    return torch.cat(slices), queries


def reach_of(
    mask_mod, batch: int, heads: int, seq_q: int, seq_k: int, score_mod=None, **where
) -> Reach | None:
    """The `Reach` (how="block_mask") of `mask_mod` and `score_mod` at these sizes, or
    None (`visible_of`)."""
    found = visible_of(mask_mod, batch, heads, seq_q, seq_k, score_mod)
    if found is None:
        return None
    visible, queries = found
    sampled = (queries, seq_q) if queries is not None else None
    return Reach.from_visible(
        visible, (batch, heads), sampled=sampled, **{"how": "block_mask", **where}
    )


def _blocks(num, indices) -> "torch.Tensor | None":
    """bool `[batch, heads, q_blocks, kv_blocks]`: the blocks listed by a BlockMask's
    (num_blocks, indices) pair (only the first `num` indices of a row count)."""
    import torch

    if num is None or indices is None:
        return None
    kv_blocks = int(indices.shape[-1])
    listed = torch.arange(kv_blocks) < num.unsqueeze(-1)
    where = torch.where(listed, indices.long(), kv_blocks)
    out = torch.zeros(*indices.shape[:-1], kv_blocks + 1, dtype=torch.bool)
    out.scatter_(-1, where, True)
    return out[..., :kv_blocks]


def kernel_visible(mask, visible, queries: tuple[int, ...] | None) -> "torch.Tensor":
    """What a kernel that skips blocks computes from `mask`'s blocks (bool, broadcast to
    `visible`'s `[batch, heads, kept queries, seq_k]`, the `mask_mod`'s own rows): every
    key of a full block, the mod's keys in a partial block, none elsewhere. Where the
    mask's batch or heads are 1 every example (head) gets the first one's blocks."""
    import torch

    partial = _blocks(mask.kv_num_blocks, mask.kv_indices)
    full = _blocks(mask.full_kv_num_blocks, mask.full_kv_indices)
    block_q, block_k = (int(s) for s in mask.BLOCK_SIZE)
    seq_q, seq_k = int(visible.shape[-2]), int(visible.shape[-1])
    kept = torch.arange(seq_q) if queries is None else torch.tensor(queries)
    rows, cols = kept // block_q, torch.arange(seq_k) // block_k
    seen = visible.clone() if partial is None else partial[..., rows, :][..., cols] & visible
    if full is not None:
        seen = seen | full[..., rows, :][..., cols]
    return seen
