"""Cost of a contract-checked forward: against the plain forward and bare jaxtyping + beartype.

The module is the seed MultiHeadAttention of `examples/seed_mha.py`, whose forward
carries the contract `x: Float[Tensor, "batch seq d_model"]`,
`mask: Bool[Tensor, "batch 1 seq seq"] | None`, `-> Float[Tensor, "batch seq d_model"]`.
Each size runs these variants side by side, in one process, on one thread
(interleaved rounds as in `_timing.compare`, median of >= 20 after warm-up, ratios
paired per round), timed in CPU time of the calling thread: with one torch thread
the whole forward runs there, and other processes on a shared machine (this one
often runs at a load of 6 on 2 cores) do not move the figure as they move the
wall clock:

- plain: the module unguarded (the baseline);
- jaxtyped: the same forward under a bare `@jaxtyped(typechecker=beartype)`;
- contract every: `guard(model, ops=False)`: the contract on each call, no op checks;
- contract first: `guard(model, ops=False, check="first")`, after its first call;
- guard every: `guard(model)`: the contract and the op-level engine (a
  TorchFunctionMode that checks every tensor op);
- guard first: `guard(model, check="first")`, after its first call;
- empty hooks: the plain module with two no-op hooks registered as guard registers
  its own (a pre-hook with kwargs, an always-call forward hook): the floor under any
  hook-based check, which `check="first"` cannot go below.

The issue's question (what do contracts cost?) is answered by the `ops=False`
rows: they time the contract alone. The `guard every` row adds the op-level
engine, whose cost `bench/overhead.py` reports; it is here so nobody reads it as
the cost of contracts. Forwards run in eval mode under `torch.no_grad()`, the
cheapest forward torch offers, so the ratios are the least flattering ones.

    python bench/contracts.py            # prints the markdown table
"""

import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import math  # noqa: E402
import time  # noqa: E402

from _timing import (  # noqa: E402
    MIN_REPEATS,
    Section,
    Table,
    Target,
    Timing,
    Variant,
    _quartiles,
    fmt_seconds,
    one_thread,
)


def compare_cpu(variants: list[Variant], *, repeats: int, warmup: int, min_sample_s: float):
    """`_timing.compare`, timed with the calling thread's CPU clock instead of the wall."""
    clock = time.thread_time

    def sample(variant: Variant, inner: int) -> float:
        fn = variant.fn
        start = clock()
        for _ in range(inner):
            fn()
        return (clock() - start) / inner

    inner = {}
    for variant in variants:
        last = 0.0
        for _ in range(max(1, warmup)):
            last = sample(variant, 1)
        inner[variant.name] = max(1, math.ceil(min_sample_s / max(last, 1e-9)))
    samples: dict[str, list[float]] = {v.name: [] for v in variants}
    for round_ in range(repeats):
        shift = round_ % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            samples[variant.name].append(sample(variant, inner[variant.name]))
    base = samples[variants[0].name]
    timings = {}
    for variant in variants:
        mine = samples[variant.name]
        ratios = [m / b for m, b in zip(mine, base, strict=True)]
        q1, q3 = _quartiles(ratios)
        timings[variant.name] = Timing(
            variant.name, statistics.median(mine), statistics.median(ratios), q1, q3, mine
        )
    return timings


TINY = ("tiny", 2, 16, 64)  # name, batch, seq, d_model
MEDIUM = ("medium", 8, 512, 512)
QUICK = (TINY, ("small", 2, 64, 128))
HEADS = 8

VARIANTS = (
    "plain",
    "jaxtyped",
    "contract every",
    "contract first",
    "guard every",
    "guard first",
    "empty hooks",
)


def _variants(size) -> list[Variant]:
    import types

    import torch
    from _timing import load_file
    from beartype import beartype
    from jaxtyping import jaxtyped

    import shapeguard

    seed = load_file("examples/seed_mha.py", "_bench_seed_mha")
    _, b, s, d = size

    def fresh(**guard_options):
        torch.manual_seed(0)  # the same weights in every variant
        # The seed class is decorated with @shapeguard.guard: unguard for the plain module.
        model = shapeguard.unguard(seed.MultiHeadAttention(d_model=d, n_heads=HEADS).eval())
        if guard_options:
            shapeguard.guard(model, **guard_options)
        return model

    plain = fresh()
    bare = fresh()
    checked = jaxtyped(typechecker=beartype)(seed.MultiHeadAttention.forward)
    bare.forward = types.MethodType(checked, bare)
    models = {
        "plain": plain,
        "jaxtyped": bare,
        "contract every": fresh(ops=False),
        "contract first": fresh(ops=False, check="first"),
        "guard every": fresh(ops=True),
        "guard first": fresh(ops=True, check="first"),
        "empty hooks": fresh(),
    }
    hooked = models["empty hooks"]
    hooked.register_forward_pre_hook(lambda module, args, kwargs: None, with_kwargs=True)
    hooked.register_forward_hook(
        lambda module, args, kwargs, output: None, with_kwargs=True, always_call=True
    )
    torch.manual_seed(1)
    x = torch.randn(b, s, d)
    mask = torch.tril(torch.ones(s, s, dtype=torch.bool)).expand(b, 1, s, s)

    def call(model):
        def run():
            with torch.no_grad():
                model(x, mask=mask)

        return run

    return [Variant(name, call(models[name])) for name in VARIANTS]


def _paired(timings, name: str, base: str) -> tuple[float, float, float]:
    """Median and quartiles of the per-round ratios of `name` to `base`."""
    ratios = [m / t for m, t in zip(timings[name].samples, timings[base].samples, strict=True)]
    q1, q3 = _quartiles(ratios)
    return statistics.median(ratios), q1, q3


def _added(timings, name: str) -> float:
    """Median of the per-round differences to plain, in seconds per call."""
    plain = timings["plain"].samples
    return statistics.median(m - p for m, p in zip(timings[name].samples, plain, strict=True))


def measure(quick: bool = False) -> list[dict]:
    """One row per (size, variant): seconds per call and ratios to plain and to jaxtyped."""
    one_thread()
    rows = []
    for size in QUICK if quick else (TINY, MEDIUM):
        name, b, s, d = size
        # Warm-up 3: check="first" checks on its first call and is timed after it. The
        # tiny size is cheap, so it gets more rounds: its ratios sit closest to the noise.
        repeats = 3 if quick else (5 * MIN_REPEATS if b * s * d < 10**5 else MIN_REPEATS)
        timings = compare_cpu(_variants(size), repeats=repeats, warmup=3, min_sample_s=0.05)
        for variant in VARIANTS:
            t = timings[variant]
            vs_jax, jax_q1, jax_q3 = _paired(timings, variant, "jaxtyped")
            rows.append(
                {
                    "size": f"{name} (B={b}, S={s}, D={d})",
                    "variant": variant,
                    "rounds": repeats,
                    "seconds": t.seconds,
                    "added seconds": _added(timings, variant),
                    "vs plain": t.ratio,
                    "vs plain q1": t.ratio_q1,
                    "vs plain q3": t.ratio_q3,
                    "vs jaxtyped": vs_jax,
                    "vs jaxtyped q1": jax_q1,
                    "vs jaxtyped q3": jax_q3,
                    # best round against best round: the figure least moved by other load
                    "best vs plain": min(t.samples) / min(timings["plain"].samples),
                    "best vs jaxtyped": min(t.samples) / min(timings["jaxtyped"].samples),
                }
            )
    return rows


def _target(what: str, limit: float, ratio: float, q1: float, q3: float) -> Target:
    measured = f"{ratio:.3f}x (IQR {q1:.3f}-{q3:.3f})"
    why = ""
    if ratio > limit >= q1:
        why = "above the target, but within the noise of this run (the IQR holds it)"
    return Target(what, f"<= {limit:.2f}x", measured, ratio <= limit, why)


def targets(rows: list[dict]) -> list[Target]:
    """The issue's two targets, per size, from the contracts-only (ops=False) rows."""
    out = []
    for size in dict.fromkeys(r["size"] for r in rows):
        by = {r["variant"]: r for r in rows if r["size"] == size}
        first, every = by["contract first"], by["contract every"]
        out.append(
            _target(
                f'check="first" vs plain after the first call, {size}',
                1.02,
                first["vs plain"],
                first["vs plain q1"],
                first["vs plain q3"],
            )
        )
        out.append(
            _target(
                f'check="every" vs bare jaxtyping + beartype, {size}',
                1.00,
                every["vs jaxtyped"],
                every["vs jaxtyped q1"],
                every["vs jaxtyped q3"],
            )
        )
    return out


def _signed(seconds: float) -> str:
    return ("-" if seconds < 0 else "+") + fmt_seconds(abs(seconds))


def table(rows: list[dict]) -> Table:
    return Table(
        "Per-call cost of the seed MHA forward (eval, no_grad, one thread, thread CPU time)",
        [
            "size",
            "variant",
            "time / call",
            "added / call",
            "vs plain (IQR)",
            "vs bare jaxtyping (IQR)",
            "best vs plain",
            "best vs bare jaxtyping",
        ],
        [
            [
                r["size"],
                r["variant"],
                fmt_seconds(r["seconds"]),
                _signed(r["added seconds"]),
                f"{r['vs plain']:.3f}x ({r['vs plain q1']:.3f}-{r['vs plain q3']:.3f})",
                f"{r['vs jaxtyped']:.3f}x ({r['vs jaxtyped q1']:.3f}-{r['vs jaxtyped q3']:.3f})",
                f"{r['best vs plain']:.3f}x",
                f"{r['best vs jaxtyped']:.3f}x",
            ]
            for r in rows
        ],
        notes=[
            "`contract every` / `contract first` are `guard(model, ops=False)`: the contract "
            "alone, which is what this table measures. `guard every` adds the op-level engine "
            "(see the Overhead section); `guard first` skips both after a signature's first call. "
            '`empty hooks` is torch\'s own cost of two no-op hooks: the floor for check="first".',
            "Ratios are medians of per-round ratios (IQR in parentheses); `best` columns divide "
            "the fastest round of each variant, the figure a busy machine moves least.",
        ],
    )


def run(quick: bool = False) -> Section:
    """The contracts section of `bench/run.py`: the table and the issue's targets."""
    rows = measure(quick)
    section = Section(
        "Contracts: checked forward vs plain vs bare jaxtyping + beartype",
        tables=[table(rows)],
    )
    if not quick:
        section.targets = targets(rows)
    return section


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    rows = measure(quick)
    print(table(rows).markdown())
    if not quick:
        print()
        for t in targets(rows):
            verdict = "met" if t.met else "MISSED" + (f" ({t.why})" if t.why else "")
            print(f"- {t.what}: target {t.target}, measured {t.measured}: {verdict}")
