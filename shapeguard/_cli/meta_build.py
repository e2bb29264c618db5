"""A model too large to build in memory at its defaults is traced on the meta device: it is
built there first (no memory), its parameters and buffers counted, and built for real only
when they fit (issue 30: meta-llama's `ModelArgs()` and litgpt's `Config()` are 4096 wide,
many GB).

The bound is fixed (`LIMIT`), not read from the memory free now, so one file is traced the
same way on every machine: above it a build for real takes minutes and most of a laptop's
memory (the probes copy the model once more, in float64), where the shapes are all a trace
needs.
"""

import contextlib
import io
import sys

# The most bytes of parameters and buffers built on cpu without being asked for with --arg.
LIMIT = 4 * 10**9


def built_on_meta(build, *, asked: bool):
    """(the model built on meta, why it stays there) when its parameters and buffers need
    more than the bound; None when it fits, or cannot be built on meta (then the build for
    real decides). `asked`: the user passed --arg values (the model is not at its defaults).
    The model's own prints and warnings while built on meta are shown only when it stays
    there (else it is built again, for real, and prints then), and the RNG is as it was."""
    import warnings

    import torch

    printed = io.StringIO()
    try:
        with (
            torch.random.fork_rng(devices=[]),
            torch.device("meta"),
            contextlib.redirect_stdout(printed),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore")
            model = build()
    except Exception:
        return None
    if not isinstance(model, torch.nn.Module):
        return None
    needed = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    if needed <= LIMIT:
        return None
    sys.stdout.write(printed.getvalue())  # the one build there is: its prints shown
    how = "as built with these --arg values" if asked else "at its defaults"
    return model, (
        f"traced on the meta device: the model {how} needs ~{_gigabytes(needed)} for its "
        f"parameters and buffers, more than the {_gigabytes(LIMIT)} shapeguard builds on cpu "
        "unasked; the checks that read values did not run (pass smaller sizes with --arg to "
        "run them)"
    )


def _gigabytes(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n < 10e9 else f"{n / 1e9:.0f} GB"
