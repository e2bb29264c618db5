"""Cost of `shapeguard.check` (one traced forward plus the semantic probes) on the seed
MultiHeadAttention at B=8, S=512, D=512, as a ratio to one plain forward.

The probes run on a float64 copy: one reference forward and one per probe (batch
independence, sub-batch at half the batch, causality, head permutation, length
change at a shorter length; token permutation and key padding do not apply to a
causal module without a padding mask), plus the traced forward in float32. The
target is under 20x.

    python bench/check_probe.py            # B=8, S=512, D=512
    python bench/check_probe.py --quick    # a small size, for a smoke run

`measure_decode` times the decode-consistency probe on a 2-layer tiny Llama with 16
decode steps (target: under 5 s).

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
    """Median seconds of one plain forward and of one `run_probes`, and their paired ratio."""
    import seed_mha
    import torch

    import shapeguard
    from shapeguard._probes.check import run_probes

    one_thread()
    torch.manual_seed(0)
    model = shapeguard.unguard(seed_mha.MultiHeadAttention(d_model=d_model, n_heads=8)).eval()
    args, kwargs = seed_mha.example_inputs(batch=batch, seq=seq, d_model=d_model)
    report = run_probes(model, args, kwargs)

    def forward():
        with torch.no_grad():
            model(*args, **kwargs)

    timings = compare(
        [Variant("forward", forward), Variant("check", lambda: run_probes(model, args, kwargs))],
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
        "probes": {
            r.name: "n/a" if r.status == "skipped" and not r.applicable else r.status
            for r in report.results
        },
    }


DECODE_TARGET_S = 5.0


def measure_decode(layers: int = 2, steps: int = 16, *, repeats: int = 3) -> dict:
    """Seconds the decode-consistency probe takes on a tiny Llama (built from a config, no
    weights downloaded): a prefill of `steps` tokens, then `steps` one-token steps, with
    the model's DynamicCache and with a StaticCache, plus the traced first step. Median
    of `repeats` runs, one thread. None when transformers is not installed."""
    import time

    import torch

    try:
        import transformers
    except ImportError:
        return {}
    from shapeguard import _probes
    from shapeguard._probes.prepare import prepare_subject
    from shapeguard._probes.report import CheckReport
    from shapeguard._probes.traced import trace_for_probes
    from shapeguard._probes.untouched import untouched

    one_thread()
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    length = 2 * steps
    ids = torch.randint(3, 100, (2, length), generator=torch.Generator().manual_seed(0))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    report = CheckReport("LlamaForCausalLM")
    with untouched(model) as work, torch.no_grad():
        traced = trace_for_probes(work, (), kwargs)
        subject = prepare_subject(work, model, (), kwargs, traced, None, 0, report)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = _probes.decode_consistency(subject)
            times.append(time.perf_counter() - start)
    times.sort()
    return {
        "model": f"LlamaForCausalLM, {layers} layers, hidden 64, batch 2",
        "steps": steps,
        "seconds": times[len(times) // 2],
        "status": result.status,
        "message": result.message.splitlines()[0],
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
    decode = measure_decode(steps=4, repeats=1) if quick else measure_decode()
    if decode:
        verdict = "under" if decode["seconds"] < DECODE_TARGET_S else "over"
        print(
            f"\ndecode consistency on a {decode['model']}, {decode['steps']} decode steps: "
            f"{fmt_seconds(decode['seconds'])} ({verdict} {DECODE_TARGET_S:.0f} s), {decode['status']}"
        )
