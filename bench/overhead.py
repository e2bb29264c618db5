"""Overhead of shapeguard on one forward, as ratios to the same forward unguarded.

Three attention modules (the seed MultiHeadAttention of `examples/seed_mha.py`,
`nn.MultiheadAttention`, and a grouped-query block on SDPA) at two sizes, each
run seven ways side by side in one process on one thread (see `_timing.compare`):

- unguarded: the baseline;
- unguarded again: the same call a second time, so the table shows the noise floor;
- guard: `shapeguard.guard(model)` in raise mode, every op checked (and, where the
  forward carries jaxtyping annotations, the contract too);
- trace: the unguarded model called inside `with shapeguard.trace():`;
- check="first": `shapeguard.guard(model, check="first")`, timed after its first call;
- disabled: the guarded model with `SHAPEGUARD=0` in the environment.

Forwards run in eval mode under `torch.no_grad()`: the cheapest forward torch
offers, so the ratios are the least flattering ones.
"""

import cProfile
import os
import pstats

from _timing import MIN_REPEATS, Section, Table, Target, Variant, compare, environ, fmt_seconds

TINY = ("tiny", 2, 16, 64)  # name, batch, seq, d_model
MEDIUM = ("medium", 8, 512, 512)
HEADS, KV_HEADS = 8, 2

VARIANTS = (
    "unguarded",
    "unguarded again",
    "guard",
    "trace",
    'check="first"',
    "disabled",
)


def _gqa_class():
    import torch.nn.functional as F
    from jaxtyping import Float
    from torch import Tensor, nn

    class GQABlock(nn.Module):
        """Grouped-query self-attention (Llama style): n_heads query heads share n_kv_heads."""

        def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
            super().__init__()
            self.d_model = d_model
            self.n_heads = n_heads
            self.n_kv_heads = n_kv_heads
            self.head_dim = d_model // n_heads
            kv_dim = n_kv_heads * self.head_dim
            self.q_proj = nn.Linear(d_model, d_model, bias=False)
            self.k_proj = nn.Linear(d_model, kv_dim, bias=False)
            self.v_proj = nn.Linear(d_model, kv_dim, bias=False)
            self.o_proj = nn.Linear(d_model, d_model, bias=False)

        def forward(
            self, x: Float[Tensor, "batch seq d_model"]
        ) -> Float[Tensor, "batch seq d_model"]:
            B, T, _ = x.shape
            H, G, D = self.n_heads, self.n_kv_heads, self.head_dim
            q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
            k = self.k_proj(x).view(B, T, G, D).transpose(1, 2)  # [B, G, T, D]
            v = self.v_proj(x).view(B, T, G, D).transpose(1, 2)
            k = k.repeat_interleave(H // G, dim=1)  # [B, H, T, D]
            v = v.repeat_interleave(H // G, dim=1)
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(context.transpose(1, 2).reshape(B, T, self.d_model))

    return GQABlock


def _models():
    """(name, build(d_model) -> plain module, inputs(batch, seq, d_model) -> (args, kwargs))."""
    import torch
    from _timing import load_file

    import shapeguard

    seed = load_file("examples/seed_mha.py", "_bench_seed_mha")
    gqa = _gqa_class()

    def seed_build(d):
        # The seed class is decorated with @shapeguard.guard: unguard to get the plain one.
        return shapeguard.unguard(seed.MultiHeadAttention(d_model=d, n_heads=HEADS))

    def seed_inputs(b, s, d):
        x = torch.randn(b, s, d)
        mask = torch.tril(torch.ones(s, s, dtype=torch.bool)).expand(b, 1, s, s)
        return (x,), {"mask": mask}

    def mha_build(d):
        return torch.nn.MultiheadAttention(d, HEADS, batch_first=True)

    def mha_inputs(b, s, d):
        x = torch.randn(b, s, d)
        return (x, x, x), {"need_weights": False}

    def gqa_build(d):
        return gqa(d, HEADS, KV_HEADS)

    def gqa_inputs(b, s, d):
        return (torch.randn(b, s, d),), {}

    return [
        ("seed MHA (examples/seed_mha.py)", seed_build, seed_inputs),
        ("nn.MultiheadAttention", mha_build, mha_inputs),
        (f"GQA block ({HEADS}/{KV_HEADS} heads, SDPA)", gqa_build, gqa_inputs),
    ]


def _variants(build, inputs, size) -> list[Variant]:
    import torch

    import shapeguard

    _, b, s, d = size

    def fresh(guard_options=None):
        torch.manual_seed(0)  # same weights in every variant
        model = build(d).eval()
        if guard_options is not None:
            shapeguard.guard(model, **guard_options)
        return model

    plain = fresh()
    guarded = fresh({})
    first = fresh({"check": "first"})
    torch.manual_seed(1)
    args, kwargs = inputs(b, s, d)

    def call(model):
        def run():
            with torch.no_grad():
                model(*args, **kwargs)

        return run

    def traced():
        with torch.no_grad(), shapeguard.trace():
            plain(*args, **kwargs)

    return [
        Variant("unguarded", call(plain)),
        Variant("unguarded again", call(plain)),
        Variant("guard", call(guarded)),
        Variant("trace", traced),
        Variant('check="first"', call(first)),
        Variant("disabled", call(guarded), context=lambda: environ("SHAPEGUARD", "0")),
    ]


def _ops_per_forward(build, inputs, size) -> int:
    """How many torch calls one forward makes, as a trace records them."""
    import torch

    import shapeguard

    _, b, s, d = size
    torch.manual_seed(0)
    model = build(d).eval()
    args, kwargs = inputs(b, s, d)
    with torch.no_grad():
        return max(1, len(shapeguard.trace(model, *args, **kwargs).events))


def _extra(timing, base) -> float:
    """Median per-round difference in seconds per call (the variant minus the baseline)."""
    import statistics

    return statistics.median(m - b for m, b in zip(timing.samples, base.samples, strict=True))


def _noise_note(timing, limit: float) -> str:
    """Say so when a missed target is still inside this run's spread."""
    if timing.ratio_q1 <= limit:
        return f"within this run's noise (the IQR holds {limit:.2f}x); "
    return ""


def _within_noise(timing) -> bool:
    """1.00x within noise: the interquartile range of the paired ratios holds 1.00,
    or the median is within 2%."""
    return timing.ratio_q1 <= 1.0 <= timing.ratio_q3 or abs(timing.ratio - 1.0) <= 0.02


def hot_spots(limit: int = 8) -> Table:
    """Where the guarded forward spends its time: cProfile of the seed MHA, tiny size."""
    import torch

    build, inputs = _models()[0][1:]
    _, b, s, d = TINY
    torch.manual_seed(0)
    import shapeguard

    model = shapeguard.guard(build(d).eval())
    args, kwargs = inputs(b, s, d)
    with torch.no_grad():
        model(*args, **kwargs)
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            model(*args, **kwargs)
        profile.disable()
    stats = pstats.Stats(profile)
    total = stats.total_tt or 1.0
    rows = []
    entries = [
        (func, tt, ct)
        for func, (_, _, tt, ct, _) in stats.stats.items()
        if os.sep + "shapeguard" + os.sep in func[0]
    ]
    entries.sort(key=lambda e: e[1], reverse=True)
    for (path, line, name), tt, ct in entries[:limit]:
        short = path[path.rindex(os.sep + "shapeguard" + os.sep) + 1 :]
        rows.append(
            [f"`{short}:{line}` {name}", f"{100 * tt / total:.0f}%", f"{100 * ct / total:.0f}%"]
        )
    return Table(
        "Where the guarded forward spends its time (cProfile, seed MHA, tiny, 20 calls)",
        ["function", "own time", "with callees"],
        rows,
        [
            "Shares of the whole profiled run (forward included); cProfile inflates "
            "Python-heavy code, so read them as a ranking, not as exact costs."
        ],
    )


def run(quick: bool = False) -> Section:
    """Measure the overhead table. `quick`: tiny size only, 3 rounds (a smoke run)."""
    from _timing import one_thread

    one_thread()
    sizes = [TINY] if quick else [TINY, MEDIUM]
    repeats = 3 if quick else MIN_REPEATS
    min_sample = 0.0 if quick else 0.02
    rows, costs, targets = [], [], []
    for name, build, inputs in _models():
        for size in sizes:
            variants = _variants(build, inputs, size)
            ops = _ops_per_forward(build, inputs, size)
            # One warm-up call is enough for a medium forward (the first call of each
            # variant, check="first"'s checked call among them, stays out of the timing).
            warmup = 1 if size is MEDIUM else 2
            timings = compare(variants, repeats=repeats, warmup=warmup, min_sample_s=min_sample)
            base = timings["unguarded"]
            label, b, s, d = size
            row = [name, f"{label} (B={b}, S={s}, D={d})", fmt_seconds(base.seconds)]
            row += [f"{timings[v].ratio_text()} ({timings[v].spread_text()})" for v in VARIANTS[1:]]
            rows.append(row)
            extra = {
                v: _extra(timings[v], base) for v in ("guard", "trace", 'check="first"', "disabled")
            }
            costs.append(
                [
                    name,
                    label,
                    str(ops),
                    fmt_seconds(extra["guard"] / ops),
                    fmt_seconds(extra["trace"] / ops),
                    fmt_seconds(extra['check="first"']),
                    fmt_seconds(extra["disabled"]),
                ]
            )
            where = f"{name}, {label}"
            off = timings["disabled"]
            targets.append(
                Target(
                    f"disabled, {where}",
                    "1.00x within noise",
                    f"{off.ratio_text()} ({off.spread_text()})",
                    _within_noise(off),
                    f"{fmt_seconds(extra['disabled'])} per call (the guard's pre- and post-check "
                    f"still run, and return at once) on a {fmt_seconds(base.seconds)} forward",
                )
            )
            first = timings['check="first"']
            first_extra = extra['check="first"']
            targets.append(
                Target(
                    f'check="first" after the first call, {where}',
                    "<= 1.02x",
                    f"{first.ratio_text()} ({first.spread_text()})",
                    first.ratio <= 1.02,
                    _noise_note(first, 1.02)
                    + f"{fmt_seconds(first_extra)} per call (the guard's checks and "
                    f"the signature lookup) on a {fmt_seconds(base.seconds)} forward",
                )
            )
            if label == "medium":
                g = timings["guard"]
                targets.append(
                    Target(
                        f"guard, {where}",
                        "<= 1.10x",
                        f"{g.ratio_text()} ({g.spread_text()})",
                        g.ratio <= 1.10,
                        _noise_note(g, 1.10)
                        + f"{fmt_seconds(extra['guard'] / ops)} per op x {ops} ops on a "
                        f"{fmt_seconds(base.seconds)} forward",
                    )
                )
    table = Table(
        "Overhead per forward, as a ratio to the unguarded forward",
        ["model", "size", "unguarded", *VARIANTS[1:]],
        rows,
        [
            f"Median of {repeats} interleaved rounds after warm-up, one thread, eval mode, "
            "`torch.no_grad()`; in parentheses the interquartile range of the per-round ratios. "
            "'unguarded again' is the same call timed twice: its spread is the noise floor.",
        ],
    )
    cost_table = Table(
        "Where the ratios come from: extra time per op and per call",
        [
            "model",
            "size",
            "ops per forward",
            "guard, per op",
            "trace, per op",
            'check="first", per call',
            "disabled, per call",
        ],
        costs,
        [
            "Median of the per-round differences to the unguarded forward (same rounds as "
            "above); 'per op' divides by the ops a trace records for one forward. A fixed cost "
            "per op or per call is a large ratio of a tiny forward and a small one of a medium "
            "forward. At the medium size these differences are inside the run's noise (see "
            "the interquartile ranges above), negative ones included: read the tiny rows.",
        ],
    )
    section = Section("Overhead", tables=[table, cost_table], targets=targets)
    if not quick:
        section.tables.append(hot_spots())
    return section
