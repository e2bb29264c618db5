"""Whether the outputs the probes compare depend on the attention at all.

A probe passes when the edited run leaves the outputs where they were. Where the
attention's result never reaches them (an output projection initialised to zero, as
diffusion U-Nets' `zero_module` and DiT's adaLN-Zero start; a gate at zero), every
deviation is 0 whatever the attention does, and a pass says nothing about it. One run
adds noise to the output of every attention op (SDPA's, flash attention's, or a product
that reads softmax weights: the context); where no compared output moves, the passes
are inconclusive.
Where the run finds no attention op, nothing is said.
"""

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .subject import Subject
from .tree import pick

# The ops whose output is attention weights (the op table's softmax step).
_SOFTMAX = _ops.spellings_where(step="softmax")
_ATTENTION = (_ops.ATTENTION, _ops.FLASH)


class _Noise:
    """An observer of one forward (`_trace.opening.run_observed`) that adds noise of its
    own scale to each attention op's output, in place (a private copy's forward, under
    no_grad). Softmax weights are followed through whatever reads them (masking, dropout,
    casts, views) to the product with V."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self.hits = 0
        self.weights = WeakTensorKeyDictionary()  # softmax outputs and what follows them

    def before(self, func, op: str, args, kwargs) -> None:
        pass

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        first = out[0] if isinstance(out, tuple | list) and out else out
        if not isinstance(first, torch.Tensor) or not first.is_floating_point():
            return
        family = _ops.lookup(op).family
        reads = any(_is_weights(self.weights, a) for a in (*args, *kwargs.values()))
        if op in _SOFTMAX:
            self.weights[first] = True
        elif family in _ATTENTION or (reads and family == _ops.PRODUCT):
            self._shake(first)
        elif reads:
            self.weights[first] = True

    def _shake(self, t: torch.Tensor) -> None:
        if not t.numel():
            return
        finite = t[torch.isfinite(t)]
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        noise = torch.randn(t.shape, generator=self.generator, dtype=torch.float64)
        t.add_(noise.to(t.dtype).to(t.device) * (scale or 1.0))
        self.hits += 1


def _is_weights(table, value) -> bool:
    if isinstance(value, torch.Tensor):
        return value in table
    if isinstance(value, list | tuple):
        return any(isinstance(v, torch.Tensor) and v in table for v in value)
    return False


def deaf(s: Subject) -> str:
    """Why the compared outputs do not depend on the attention ("" where they do, or
    where no attention op was found to test it with)."""
    from .._trace.opening import run_observed

    leaves = [leaf for leaf in s.layout.outputs if leaf.path in s.refs]
    if not leaves:
        return ""
    args, kwargs = s.inputs
    noise = _Noise(torch.Generator().manual_seed(0))
    out = run_observed(s.model, args, kwargs, lambda session: noise)
    if not noise.hits:
        return ""
    got = {leaf.path: pick(out, leaf.path) for leaf in leaves}
    dev = s.measure(got, s.refs, leaves)
    if dev > s.rtol:
        return ""
    ops = "op" if noise.hits == 1 else "ops"
    return (
        f"the output does not depend on the attention: noise added to the output of "
        f"{noise.hits} attention {ops} left it unchanged (deviation {dev:.1e}), so no probe "
        "can see what the attention does (an output projection or a gate initialised to "
        "zero, as zero_module and adaLN-Zero start)"
    )
