"""How the cost of a meta-device trace grows with depth: it must be linear in layers.

The Llama-70B-shaped stack of `bench/models/llama70b_attention.py` (d_model 8192,
64 query / 8 kv heads, seq 8192, all on the meta device, so no memory) is built
at 10, 20, 40 and 80 layers and traced side by side (`_timing.compare`, the
10-layer stack as baseline). Linear growth means a flat cost per layer: the
time ratio to 10 layers equals the layer ratio, and a straight-line fit
explains the times.
"""

from _timing import MIN_REPEATS, Section, Table, Target, Variant, compare, fmt_seconds

LAYERS = (10, 20, 40, 80)
QUICK_LAYERS = (1, 2)
# Linear: the cost per layer of the deepest stack within this factor of the shallowest's.
LINEAR_TOLERANCE = 1.25


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares line y = a + b x: (a, b, R^2)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return a, b, 1.0 - ss_res / ss_tot if ss_tot else 1.0


def run(quick: bool = False) -> Section:
    """Trace the stack at each depth; report times, per-layer cost, fit and the target."""
    import torch
    from _timing import load_file, one_thread

    import shapeguard

    one_thread()
    section = Section("Scale: growth with layers (meta device)")
    try:
        stack = load_file("bench/models/llama70b_attention.py", "_bench_llama70b")
    except (ImportError, FileNotFoundError) as error:
        section.notes.append(f"not available yet: {error}")
        return section
    layers = QUICK_LAYERS if quick else LAYERS
    repeats = 2 if quick else MIN_REPEATS
    models = {}
    with torch.device("meta"):
        (x,) = stack.example_inputs()
        for n in layers:
            models[n] = stack.build_model(n_layers=n)
    last = {}  # each depth's latest trace, for its event count

    def traced(n):
        def run():
            last[n] = shapeguard.trace(models[n], x)

        return run

    timings = compare(
        [Variant(f"{n} layers", traced(n)) for n in layers],
        repeats=repeats,
        warmup=1,
        min_sample_s=0.0,
    )
    events = {n: len(last[n].events) for n in layers}
    base_n = layers[0]
    rows = []
    per_layer = {}
    for n in layers:
        t = timings[f"{n} layers"]
        per_layer[n] = t.seconds / n
        rows.append(
            [
                str(n),
                fmt_seconds(t.seconds),
                fmt_seconds(per_layer[n]),
                f"{t.ratio:.2f}x ({t.spread_text()})",
                f"{n / base_n:.0f}x",
                f"{t.ratio / (n / base_n):.2f}",
                str(events[n]),
                f"{events[n] / n:.1f}",
            ]
        )
    a, b, r2 = _fit([float(n) for n in layers], [timings[f"{n} layers"].seconds for n in layers])
    deepest = layers[-1]
    drift = per_layer[deepest] / per_layer[base_n]
    table = Table(
        f"Trace time by depth, d_model {stack.D_MODEL}, {stack.N_HEADS}/{stack.N_KV_HEADS} heads, "
        f"seq {stack.SEQ}, meta device",
        [
            "layers",
            "trace time",
            "per layer",
            f"time ratio to {base_n} layers",
            "layer ratio",
            "time ratio per layer ratio",
            "events",
            "events per layer",
        ],
        rows,
        [
            f"Median of {repeats} interleaved rounds, one thread; the model is built once per "
            "depth, outside the timing. Straight-line fit: "
            f"time = {fmt_seconds(a)} + {fmt_seconds(b)} per layer, R^2 = {r2:.4f}. "
            "'time ratio per layer ratio' is 1.00 for perfectly linear growth.",
        ],
    )
    section.tables.append(table)
    section.targets.append(
        Target(
            f"trace cost grows linearly with layers ({', '.join(map(str, layers))})",
            f"per-layer cost at {deepest} layers within {LINEAR_TOLERANCE:.2f}x of {base_n}'s",
            f"{drift:.2f}x (fit R^2 {r2:.4f}, {fmt_seconds(b)}/layer)",
            drift <= LINEAR_TOLERANCE,
        )
    )
    return section
