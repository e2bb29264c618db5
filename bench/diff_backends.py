"""`shapeguard.diff` with backends eager against sdpa over the world corpus' decoders.

Each decoder of the --quick sample (bench/_world_sizes.QUICK; --all: every decoder) is
built as bench/world.py builds it (tiny config, sizes d: batch 3, seq 7, heads 4, kv
heads 2, head_dim 16), with no padding (--padding l or r: left or right padding; the
padded positions the attention_mask establishes are not compared, since a padded query
row that sees no key differs in transformers itself), and compared with itself on the
two implementations. Prints one line per model (agree, diverge with the first divergence,
refused: the model has no sdpa path, crash) and the counts last; exit status 1 when a
model diverges.

    python bench/diff_backends.py [--all] [--only llama,gpt2] [--backends eager,sdpa]
                                  [--padding n|l|r]
"""

import argparse
import os
import sys
import time
import warnings

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.path.insert(0, os.path.dirname(BENCH))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every decoder, not the sample")
    parser.add_argument("--only", help="model types, comma-separated")
    parser.add_argument("--backends", default="eager,sdpa")
    parser.add_argument("--padding", default="n", choices=("n", "l", "r"))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch
    from _world_build import build
    from _world_candidates import candidates
    from _world_inputs import make
    from _world_sizes import QUICK, SIZES

    import shapeguard
    from shapeguard._diff.engine import DiffOptionError

    backends = tuple(args.backends.split(","))
    wanted = set(args.only.split(",")) if args.only else None
    chosen = [
        c
        for c in candidates()[0]
        if c.kind in ("decoder", "decoder_base")
        and (c.model_type in wanted if wanted else args.all or c.model_type in QUICK)
    ]
    counts = {"agree": 0, "diverge": 0, "refused": 0, "crash": 0}
    for candidate in chosen:
        start = time.perf_counter()
        try:
            model, _ = build(candidate, SIZES["d"], impl=backends[0])
            inputs = make(
                candidate, model, SIZES["d"], args.padding, torch.Generator().manual_seed(0), 32
            )
            try:
                result = shapeguard.diff(model, None, backends=backends, **inputs)
            except DiffOptionError as error:
                if "cannot switch after it is built" not in str(error):
                    raise
                # Built once per implementation instead, the weights copied by name.
                try:
                    other, _ = build(candidate, SIZES["d"], impl=backends[1])
                except ValueError as refused:  # transformers: no such path for the model
                    raise DiffOptionError(f"backends: {backends[1]!r}: {refused}") from None
                result = shapeguard.diff(model, other, backends=backends, **inputs)
        except DiffOptionError as error:
            state, line = "refused", str(error).split(". ")[0]
        except Exception as error:  # noqa: BLE001 (a bench line per model)
            state, line = "crash", f"{type(error).__name__}: {str(error)[:120]}"
        else:
            state = "agree" if result.agree else "diverge"
            line = f"{result.compared} aligned compared, largest error {result.largest:.2g} of tolerance"
            line += "".join(
                f"; {note.split(' (')[0]}" for note in result.notes if note.startswith("padded")
            )
            if result.first is not None:
                line = str(result).rstrip()
        counts[state] += 1
        took = time.perf_counter() - start
        print(f"{candidate.model_type:24} {state:8} {took:5.1f}s  {line}", flush=True)
    print(", ".join(f"{k} {v}" for k, v in counts.items()) + f" of {len(chosen)} decoders")
    return 1 if counts["diverge"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
