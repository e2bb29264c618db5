"""The probes measured inside a block whose output does not depend on its attention.

A zero-initialised output projection (`zero_module`), DiT's adaLN-Zero gate or a gated
cross-attention's `tanh(gate)` at zero make the block return its input: every probe of
its output passes, bug or none. The properties the probes test hold for every weight the
block will be trained to, so they hold where the attention's effect stops too: at the
input of the zero projection (the context before it) or, where no module stops it, the
outermost module output the attention moves (`liveness.live_points`). `Inner` runs the
unmodified module and returns those tensors; it is traced like the module, so their batch
and token axes are read from provenance, and probed like any output: a failure is still an
edited input the module runs, and a measured tensor that moves where it must not.
"""

import torch

from .liveness import Point
from .result import ProbeResult


class Inner(torch.nn.Module):
    """The module, returning the tensors at `points` (one per point, in order) instead of
    its own output. Its hooks live for one forward, so a copy (float64, head-permuted)
    carries none."""

    def __init__(self, block: torch.nn.Module, points: list[Point]) -> None:
        super().__init__()
        # Registered under its class's name: the traced re-runs of a failed probe name
        # its ops' modules as the module's own trace does ("(CrossAttentionBlock)").
        name = type(block).__name__
        self.named = name if name.isidentifier() and not hasattr(self, name) else "block"
        self.add_module(self.named, block)
        self.points = list(points)

    @property
    def block(self) -> torch.nn.Module:
        return self.get_submodule(self.named)

    def forward(self, *args, **kwargs):
        from .tree import first_output

        seen: dict[int, torch.Tensor] = {}
        handles = []

        def keep(i: int, value) -> None:
            t = first_output(value)
            if i not in seen and t is not None:
                seen[i] = t

        try:
            for i, point in enumerate(self.points):
                module = self.block.get_submodule(point.path)
                if point.side == "input":
                    hook = _before(keep, i)
                    handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
                else:
                    handles.append(module.register_forward_hook(_after(keep, i)))
            self.block(*args, **kwargs)
        finally:
            for handle in handles:
                handle.remove()
        missing = [p.path for i, p in enumerate(self.points) if i not in seen]
        if missing:
            raise RuntimeError(f"the forward did not reach {', '.join(missing)}")
        return tuple(seen[i] for i in range(len(self.points)))


def _named_like(block: torch.nn.Module) -> type:
    """`Inner` with the block's forward signature, so its inputs keep their names
    (`prepare_subject` reads them from it)."""
    import contextlib
    import inspect

    def forward(self, *args, **kwargs):
        return Inner.forward(self, *args, **kwargs)

    with contextlib.suppress(TypeError, ValueError):
        forward.__signature__ = inspect.signature(type(block).forward)  # type: ignore[attr-defined]
    return type(f"Inner{type(block).__name__}", (Inner,), {"forward": forward})


def _before(keep, i: int):
    def hook(module, args, kwargs):
        keep(i, (args, kwargs))

    return hook


def _after(keep, i: int):
    def hook(module, args, out):
        keep(i, out)

    return hook


def where(points: list[Point]) -> str:
    """The points in words: "the input of proj_out (Linear) at block.py:34 `return x +
    self.proj_out(out)`", the first two, then a count."""
    said = []
    for point in points[:2]:
        at = f" at {point.site}" if point.site else ""
        said.append(f"the {point.side} of {point.path} ({point.what}){at}")
    more = f" and {len(points) - 2} more" if len(points) > 2 else ""
    return "; ".join(said) + more


def inner_subject(work, args, kwargs, points: list[Point], traced, causal, seed):
    """The subject whose outputs are the tensors at `points` of `work` (the module the
    probes copy), traced so their axes are known; or why there is none (a string)."""
    from .prepare import prepare_subject
    from .report import CheckReport
    from .traced import trace_for_probes

    inner = _named_like(work)(work, points)
    again = trace_for_probes(inner, args, kwargs, like=traced)
    if again.error is not None:
        return f"the module fails when traced for them ({again.error})"
    made = prepare_subject(inner, inner, args, kwargs, again, causal, seed, CheckReport(""))
    if isinstance(made, ProbeResult):
        return made.message.splitlines()[0]
    if made.void:
        return made.void
    return made
