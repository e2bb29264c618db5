"""The module under probe: a private copy, its inputs, its reference output, and the verdict."""

from dataclasses import dataclass

import torch

from .. import _axes
from .edits import take
from .layout import Layout
from .result import ProbeResult
from .tree import first_output
from .watch import Watch


@dataclass(slots=True)
class Subject:
    """A private copy of the module, its inputs, and what the trace found."""

    model: torch.nn.Module
    inputs: tuple  # (args, kwargs)
    layout: Layout
    reference: torch.Tensor
    out_batch: int | None
    out_seq: int | None
    watch: Watch
    events: list
    declared: dict
    rtol: float
    generator: torch.Generator
    causal: str = ""
    traced_model: torch.nn.Module | None = None  # the copy the trace ran (its Linears)

    def run(self, inputs) -> torch.Tensor:
        args, kwargs = inputs
        out = first_output(self.model(*args, **kwargs))
        if out is None:
            raise RuntimeError("the module returned no floating-point tensor")
        return out

    def result(
        self,
        name: str,
        dev: float,
        action: str,
        target: str,
        hint: str,
        point=None,
        lead: str = "first seen at ",
    ) -> ProbeResult:
        """Passed or failed by `dev` against the tolerance: "<action> left <target>
        unchanged", or "<action> moved <target> by ..." with the op `point()` names."""
        tol = self.rtol
        if dev <= tol:
            return ProbeResult(
                name, "passed", f"{action} left {target} unchanged (deviation {dev:.1e})", dev, tol
            )
        op = point() if point is not None else ""
        where = f"\n  {lead}{op}" if op else ""
        return ProbeResult(
            name,
            "failed",
            f"{action} moved {target} by {_fmt(dev)} of the output's scale (tolerance "
            f"{tol:.0e}){where}\n  hint: {hint}",
            dev,
            tol,
            op,
        )


def _fmt(dev: float) -> str:
    return "inf (NaN appeared)" if dev == float("inf") else f"{dev:.2g}"


def out_rows(subject: Subject, out: torch.Tensor, *, examples=None, positions=None):
    """The output restricted to some examples (batch axis) and query positions (seq axis)."""
    if examples is not None:
        out = take(out, subject.out_batch, torch.as_tensor(examples))
    if positions is not None:
        out = take(out, subject.out_seq, torch.as_tensor(positions))
    return out


def declared_sizes(model) -> dict:
    """The sizes the first module that declares a head count declares (heads, d_k, ...)."""
    for module in model.modules():
        found = _axes.declared_sizes(module)
        if "heads" in found:
            return found
    return {}
