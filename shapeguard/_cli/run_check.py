"""`shapeguard run --check`: the semantic probes on the inputs the program really passed.

The first traced call of each watched module keeps a copy of its inputs (tensors detached
and cloned before its forward runs, so an in-place write in forward does not reach them),
at most `MAX_BYTES` of tensors per module: past it nothing is kept and the probes say so.
After the program ends, the probes (`check_summary.summary_rows`, as `shapeguard check`
runs them) run on the module in eval mode, its modes restored after: dropout would move the
outputs the probes compare. Then the copies are dropped: no tensor outlives the command.
"""

from dataclasses import dataclass

from .check_summary import Summary, probe_runner, summary_rows
from .run import Run

MAX_BYTES = 64 << 20  # 64 MiB of input tensors per module


@dataclass(slots=True)
class Sample:
    """The inputs of a module's first traced call, copied."""

    args: tuple
    kwargs: dict


def copy_inputs(args: tuple, kwargs: dict) -> Sample | None:
    """The call's inputs with every tensor detached and cloned; None past `MAX_BYTES`."""
    import torch

    total = 0

    def size(value) -> None:
        nonlocal total
        if isinstance(value, torch.Tensor):
            total += value.numel() * value.element_size()
        elif isinstance(value, tuple | list):
            for item in value:
                size(item)
        elif isinstance(value, dict):
            for item in value.values():
                size(item)

    size(args)
    size(kwargs)
    if total > MAX_BYTES:
        return None

    def copy(value):
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        if isinstance(value, tuple | list):
            return type(value)(copy(item) for item in value)
        if isinstance(value, dict):
            return {key: copy(item) for key, item in value.items()}
        return value

    return Sample(copy(args), copy(kwargs))


def check_module(module, sample: Sample | None, trace) -> Summary:
    """The probes on `module` with the recorded inputs, in eval mode (modes restored)."""
    if sample is None:
        return Summary(
            [
                (
                    "semantic probes",
                    "skip",
                    f"the inputs are over {MAX_BYTES >> 20} MiB: no copy was kept for the probes",
                )
            ]
        )
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        return summary_rows(module, sample, Run(trace), "cpu", find_runner=probe_runner)
    finally:
        for m, training in modes:
            m.training = training
