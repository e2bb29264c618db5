"""The world corpus' decoders with `attn_implementation="flex_attention"`, traced.

Each decoder of the --quick sample (bench/_world_sizes.QUICK; --all: every decoder) that
transformers builds with FlexAttention on this machine is built as bench/world.py builds
it, at the three size settings and with no, left and right padding, and traced once; the
trace's findings, a crash inside the trace, and any difference from the untraced output
(bit for bit, against an untraced call after the one that compiles) are counted. A model transformers refuses to build with flex is "refused".
Exit status 1 on a finding, a crash or a difference.

    python bench/world_flex.py [--all] [--only llama,qwen2]
"""

import argparse
import os
import sys
import time
import warnings

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.dirname(BENCH))


def _output(out):
    """The first tensor of a model's output (logits or last hidden state)."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    for value in out.values() if hasattr(out, "values") else out:
        if isinstance(value, torch.Tensor):
            return value
    return None


def _same(a, b) -> bool:
    """Bit for bit, NaN where the other has NaN (a tiny random model can give NaN logits:
    `torch.equal` would call a run unequal to itself)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every decoder, not the sample")
    parser.add_argument("--only", help="model types, comma-separated")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch
    from _world_build import build
    from _world_candidates import candidates
    from _world_inputs import make
    from _world_sizes import QUICK, SIZES

    import shapeguard

    wanted = set(args.only.split(",")) if args.only else None
    chosen = [
        c
        for c in candidates()[0]
        if c.kind in ("decoder", "decoder_base")
        and (c.model_type in wanted if wanted else args.all or c.model_type in QUICK)
    ]
    counts = {"clean": 0, "finding": 0, "crash": 0, "differs": 0, "refused": 0}
    for candidate in chosen:
        start = time.perf_counter()
        lines = []
        state = "clean"
        for size in SIZES:
            try:
                model, _ = build(candidate, SIZES[size], impl="flex_attention")
            except Exception as refused:  # noqa: BLE001 (transformers: no flex path)
                state, lines = "refused", [f"{type(refused).__name__}: {str(refused)[:100]}"]
                break
            for padding in "nlr":
                inputs = make(
                    candidate, model, SIZES[size], padding, torch.Generator().manual_seed(0), 32
                )
                with torch.no_grad():
                    # The first call compiles flex_attention; the compiled kernel's output
                    # is the one every later call, traced or not, gives.
                    model(**inputs)
                    plain = _output(model(**inputs))
                    try:
                        with shapeguard.trace(mode="warn") as trace:
                            traced = _output(model(**inputs))
                    except Exception as error:  # noqa: BLE001 (a bench line per model)
                        state = "crash"
                        lines.append(
                            f"{size}/{padding}: {type(error).__name__}: {str(error)[:100]}"
                        )
                        continue
                if trace.findings:
                    state = "finding" if state == "clean" else state
                    lines += [f"{size}/{padding}: {f.kind}: {f.headline}" for f in trace.findings]
                if plain is not None and traced is not None and not _same(plain, traced):
                    with torch.no_grad():
                        again = _output(model(**inputs))
                    by = (plain - traced).abs().nan_to_num(float("inf")).max().item()
                    if again is not None and not _same(plain, again):
                        # An untraced call differs too: the compiled kernel itself changed
                        # (dynamo recompiled, or fell back to eager past its recompile limit).
                        lines.append(f"{size}/{padding}: untraced calls differ too (by {by:.2g})")
                        continue
                    state = "differs" if state == "clean" else state
                    lines.append(
                        f"{size}/{padding}: output differs from the untraced run by {by:.2g}"
                    )
        counts[state] += 1
        took = time.perf_counter() - start
        print(f"{candidate.model_type}: {state} ({took:.1f}s)", flush=True)
        for line in lines[:6]:
            print(f"    {line}", flush=True)
    print("world flex: " + ", ".join(f"{k} {v}" for k, v in counts.items()), flush=True)
    return 1 if counts["finding"] or counts["crash"] or counts["differs"] else 0


if __name__ == "__main__":
    sys.exit(main())
