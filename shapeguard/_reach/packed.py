"""The reach of packed (varlen) attention: the tokens of every sequence back to back,
delimited by `cu_seqlens`, each query seeing the keys of its own sequence only, causal
and windows aligned bottom-right within it as flash-attn aligns them. Computed as runs
from the boundaries, on sampled queries, so the cost does not grow with the tokens'
product: one run per kept query, `rows.MAX_QUERIES` of them at most."""

from bisect import bisect_right

from .rows import Reach, Runs, sampled_queries


def runs_of(
    cu_q: tuple[int, ...],
    cu_k: tuple[int, ...],
    query: int,
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
) -> Runs:
    """The keys packed query `query` sees: its sequence's keys, cut to the causal
    triangle and the window `(left, right)` (-1: unbounded) around its position, which
    is aligned to the end of the sequence's keys (query p of n_q sits at key p + n_k - n_q)."""
    sequence = bisect_right(cu_q, query) - 1
    first_k, end_k = cu_k[sequence], cu_k[sequence + 1]
    n_q, n_k = cu_q[sequence + 1] - cu_q[sequence], end_k - first_k
    at = query - cu_q[sequence] + n_k - n_q
    left, right = window
    low = max(0, at - left) if left >= 0 else 0
    high = min(n_k, at + right + 1) if right >= 0 else n_k
    if causal:
        high = min(high, at + 1)
    return ((first_k + low, first_k + high),) if low < high else ()


def reach_of(
    cu_q: tuple[int, ...],
    cu_k: tuple[int, ...],
    heads: int,
    *,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    **where,
) -> Reach | None:
    """The `Reach` (how="cu_seqlens", lead `[heads]`, every head alike) over the packed
    tokens, or None where the boundaries are not a valid pair (the contract says why)."""
    if len(cu_q) < 2 or len(cu_q) != len(cu_k) or cu_q[0] != 0 or cu_k[0] != 0:
        return None
    if list(cu_q) != sorted(cu_q) or list(cu_k) != sorted(cu_k):
        return None
    total_q, total_k = cu_q[-1], cu_k[-1]
    queries = sampled_queries(total_q)
    kept = range(total_q) if queries is None else queries
    runs = [runs_of(cu_q, cu_k, q, causal=causal, window=window) for q in kept]
    return Reach.from_runs(
        runs,
        queries,
        total_q,
        total_k,
        (heads,),
        **{"how": "cu_seqlens", "lead_axes": ("heads",), **where},
    )
