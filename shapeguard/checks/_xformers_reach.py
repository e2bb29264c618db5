"""The reach of xformers' `memory_efficient_attention`, read from its `attn_bias` before
the call runs (on a CPU the kernel then fails; the reach is kept): a block-diagonal bias
(BlockDiagonalMask and its kinds) by its seqstarts, each block's mask made by the bias's
own `_create_block_mask` (so its causal, bottom-right and local kinds are xformers' own);
any other bias class (padded or gappy keys too) by
`materialize((seq_q, seq_k))`, and a tensor bias by its values, where a key is hidden at
-inf or at or below the mask reader's `HIDING`. Bounded: at most `MAX_CELLS` cells are
made at once, on sampled queries; past it, or where a value cannot be read (not on the
CPU), no reach is read and nothing is claimed.

q, k, v are `[batch, seq, heads, d_k]` (or `[batch, seq, d_k]`, one head); the reach's
lead is `(batch, heads)`. The grouped `[batch, seq, groups, heads, d_k]` form is not
read.
"""

from .._reach.rows import Reach, Runs, query_sample, runs_where
from .._values import is_tensor
from ._mask_effects import readable
from ._mask_uses import HIDING
from ._view import CallView
from .xformers import is_block_diagonal, is_xformers, tensor_bias

# Cells of one made mask (float32: 16 MiB at the bound).
MAX_CELLS = 1 << 22


def reach_of(call: CallView, where: dict) -> Reach | None:
    """The call's reach, or None where it is not xformers' or cannot be read."""
    if not is_xformers(call.func):
        return None
    bound = call.bound()
    q, k, bias = bound.get("query"), bound.get("key"), bound.get("attn_bias")
    if not (is_tensor(q) and is_tensor(k)) or q.dim() not in (3, 4) or k.dim() != q.dim():
        return None
    batch, seq_q, seq_k = int(q.shape[0]), int(q.shape[1]), int(k.shape[1])
    heads = int(q.shape[2]) if q.dim() == 4 else 1
    lead = (batch, heads)
    where = {**where, "lead_axes": ("batch", "heads")}
    try:
        queries = query_sample(lead, seq_q)
    except ValueError:
        return None
    kept = list(range(seq_q)) if queries is None else list(queries)
    if bias is None:
        runs: list[Runs] = [((0, seq_k),)] * len(kept)
        return Reach.from_runs(runs, queries, seq_q, seq_k, lead, how="unmasked", **where)
    if is_block_diagonal(bias) and batch != 1:
        return None  # `xformers_bias` says it
    if any(c.__name__ == "BlockDiagonalMask" for c in type(bias).__mro__):
        found = _block_runs(bias, kept, seq_q, seq_k)
        if found is None:
            return None
        return Reach.from_runs(found, queries, seq_q, seq_k, lead, how="attn_bias", **where)
    return _materialized(bias, lead, seq_q, seq_k, queries, kept, where)


def _block_runs(bias, kept: list[int], seq_q: int, seq_k: int) -> list[Runs] | None:
    """The runs each kept packed query sees: its block's keys, as the bias's own block
    mask shows them; None where the seqstarts do not cover q and k, or a block is past
    the bound."""
    q_starts, k_starts = bias.q_seqinfo.seqstart_py, bias.k_seqinfo.seqstart_py
    make = getattr(bias, "_create_block_mask", None)
    if make is None or len(q_starts) != len(k_starts) or len(q_starts) < 2:
        return None
    if q_starts[-1] != seq_q or k_starts[-1] != seq_k or q_starts[0] != 0 or k_starts[0] != 0:
        return None
    import torch

    runs: list[Runs] = []
    block, rows = -1, None
    for query in kept:
        while query >= q_starts[block + 1]:
            block += 1
            rows = None
        q0, q1 = q_starts[block], q_starts[block + 1]
        k0, k1 = k_starts[block], k_starts[block + 1]
        if rows is None:
            if (q1 - q0) * (k1 - k0) > MAX_CELLS:
                return None
            try:
                with torch.no_grad():
                    rows = _visible(make((q1 - q0, k1 - k0)))
            except Exception:  # a bias kind this reading does not know: no reach
                return None
        runs.append(tuple((k0 + a, k0 + b) for a, b in runs_where(rows[query - q0].tolist())))
    return runs


def _materialized(bias, lead, seq_q, seq_k, queries, kept, where) -> Reach | None:
    """A tensor bias's values, or a mask class's `materialize` (plus the tensor it adds)."""
    import torch

    batch, heads = lead
    held = tensor_bias(bias)
    full = (batch, heads, seq_q, seq_k)
    if held is not None and (tuple(int(s) for s in held.shape) != full or not readable(held)):
        return None  # a wrong shape is `xformers_bias`'s; on an accelerator, unread
    index = torch.tensor(kept)
    with torch.no_grad():
        if held is bias:
            visible = _visible(held.index_select(-2, index))
            how = "mask"
        else:
            if seq_q * seq_k > MAX_CELLS:
                return None
            try:  # [seq_q, seq_k], plus the tensor it adds ([batch, heads, ...]) if any
                made = bias.materialize((seq_q, seq_k))
            except Exception:  # a bias kind that needs more than its shape (paged): no reach
                return None
            visible = _visible(made.index_select(-2, index))
            how = "attn_bias"
    sampled = (queries, seq_q) if queries is not None else None
    return Reach.from_visible(visible, lead, sampled=sampled, how=how, **where)


def _visible(values):
    """True where a key can be seen: above `HIDING` (and so not -inf, not NaN)."""
    return values > HIDING
