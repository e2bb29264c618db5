"""Cost of `shapeguard.check` (one traced forward plus the semantic probes) on the seed
MultiHeadAttention at B=8, S=512, D=512, as a ratio to one plain forward.

The probes run on a float64 copy: one reference forward and one per probe (batch
independence, sub-batch at half the batch, causality, head permutation, length
change at a shorter length; token permutation and key padding do not apply to a
causal module without a padding mask), plus the traced forward in float32. The
target is under 20x.

    python bench/check_probe.py            # B=8, S=512, D=512
    python bench/check_probe.py --quick    # a small size, for a smoke run

Timed side by side in one process on one thread (see `_timing.compare`).
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

from _timing import Variant, compare, fmt_seconds, one_thread  # noqa: E402

TARGET = 20.0


def measure(batch: int = 8, seq: int = 512, d_model: int = 512, *, repeats: int = 5) -> dict:
    """Median seconds of one plain forward and of one `run_check`, and their paired ratio."""
    import seed_mha
    import torch

    import shapeguard
    from shapeguard._check import run_check

    one_thread()
    torch.manual_seed(0)
    model = shapeguard.unguard(seed_mha.MultiHeadAttention(d_model=d_model, n_heads=8)).eval()
    args, kwargs = seed_mha.example_inputs(batch=batch, seq=seq, d_model=d_model)
    report = run_check(model, args, kwargs)

    def forward():
        with torch.no_grad():
            model(*args, **kwargs)

    timings = compare(
        [Variant("forward", forward), Variant("check", lambda: run_check(model, args, kwargs))],
        repeats=repeats,
        warmup=1,
    )
    check = timings["check"]
    return {
        "size": f"B={batch}, S={seq}, D={d_model}",
        "forward_s": timings["forward"].seconds,
        "check_s": check.seconds,
        "ratio": check.ratio,
        "ratio_q1": check.ratio_q1,
        "ratio_q3": check.ratio_q3,
        "passed": report.passed,
        "probes": {r.name: r.status for r in report.results},
    }


def markdown(result: dict) -> str:
    verdict = "under" if result["ratio"] < TARGET else "over"
    lines = [
        f"`shapeguard.check` on the seed MultiHeadAttention, {result['size']}, one thread:",
        "",
        "| plain forward | check | ratio (IQR) | target |",
        "| --- | --- | --- | --- |",
        f"| {fmt_seconds(result['forward_s'])} | {fmt_seconds(result['check_s'])} | "
        f"{result['ratio']:.1f}x ({result['ratio_q1']:.1f}-{result['ratio_q3']:.1f}) | "
        f"{verdict} {TARGET:.0f}x |",
        "",
        "probes: " + ", ".join(f"{name} {status}" for name, status in result["probes"].items()),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    result = measure(2, 16, 64, repeats=3) if quick else measure()
    print(markdown(result))
