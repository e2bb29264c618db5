"""The cost of reading each attention site's reach (issue 28), as a ratio to the same
trace without it (`shapeguard.checks.reach.off`), measured side by side.

Workloads: the tiny transformers Llama forward of `cost.py` (SDPA sites), and one
attention layer at 4,096 tokens: hand-written scores masked by `masked_fill` and read
by softmax (B=1, H=1: the largest scores whose values a trace reads, 2^24 elements), and
SDPA with a bool causal mask (B=1, H=8). Each variant runs a fresh `with trace():` per
call at its own line, so from its third call on it replays, as a repeated forward does.

Memory: a site builds at most `MAX_ROWS` (16,384) x seq_k bools at once (its sampled
queries: at most 512 per example and head, fewer past 32 leading slices), 64 MiB at
4,096 keys, plus the same rows of the float scores where a softmax is read (256 MiB at
4,096 keys in float32, transient); a trace keeps runs, never the rows, and at most
`MAX_REACH` (256) distinct reaches.
"""

import math

from _timing import MIN_REPEATS, Section, Table, Variant, compare, fmt_seconds, one_thread

SEQ = 4096
QUICK_SEQ = 512  # a smoke run's (tests/test_bench_smoke.py): seconds, not a minute


class _Softmax:
    """softmax(Q K^T / sqrt(d) with the future filled with -inf) V, written out."""

    def __init__(self, d: int) -> None:
        self.scale = 1 / math.sqrt(d)

    def __call__(self, q, k, v, future):
        import torch

        scores = (q @ k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(future, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def _long_workloads(seq: int):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    q1 = torch.randn(1, 1, seq, 64)
    future = torch.ones(seq, seq, dtype=torch.bool).triu(1)
    layer = _Softmax(64)
    q8 = torch.randn(1, 8, seq, 64)
    keep = ~future
    return [
        (
            f"masked_fill + softmax, B=1, H=1, S={seq}",
            lambda: layer(q1, q1, q1, future),
        ),
        (
            f"SDPA, bool causal mask, B=1, H=8, S={seq}",
            lambda: F.scaled_dot_product_attention(q8, q8, q8, attn_mask=keep),
        ),
    ]


def _llama_workload():
    import cost

    found = cost._llama_workloads(quick=True)
    if not found:
        return None
    w = found[0]
    model = w.build()
    return f"tiny Llama forward ({w.size})", lambda: w.call(model)


def _variants(call):
    import shapeguard
    from shapeguard.checks import reach

    def with_reach():
        with shapeguard.trace():
            call()

    def without_reach():
        with shapeguard.trace():
            call()

    return [
        Variant("trace without reach", without_reach, context=reach.off),
        Variant("trace with reach", with_reach),
    ]


def _count(call) -> int:
    import shapeguard

    with shapeguard.trace() as t:
        call()
    return len(t.reach)


def run(quick: bool = False) -> Section:
    import torch

    one_thread()
    rows = []
    workloads = []
    llama = _llama_workload()
    if llama is not None:
        workloads.append((*llama, 3 if quick else MIN_REPEATS, 0.0 if quick else 0.02))
    for name, call in _long_workloads(QUICK_SEQ if quick else SEQ):
        workloads.append((name, call, 2 if quick else 5, 0.0))
    with torch.no_grad():
        for name, call, repeats, sample in workloads:
            timings = compare(_variants(call), repeats=repeats, warmup=3, min_sample_s=sample)
            base, mine = timings["trace without reach"], timings["trace with reach"]
            rows.append(
                [
                    name,
                    str(_count(call)),  # sites kept by one trace
                    fmt_seconds(base.seconds),
                    f"{mine.ratio_text()} ({mine.spread_text()})",
                ]
            )
    table = Table(
        "Reach at every attention site: the trace with reach vs without",
        ["workload", "sites kept", "trace without reach", "trace with reach"],
        rows,
        notes=[
            "Ratios: median of per-round ratios to the trace without reach (interquartile "
            "range), the same calls side by side; from the third call on each variant replays.",
            "Memory bound: at most MAX_ROWS (16,384) sampled query rows x seq_k bools built "
            "at a site at once (64 MiB at 4,096 keys), plus those rows of the float scores "
            "where a softmax is read; the trace keeps runs per distinct row, at most 256 "
            "distinct reaches.",
        ],
    )
    return Section(TITLES, tables=[table])


TITLES = "Attention reach: its cost per trace (issue 28)"
