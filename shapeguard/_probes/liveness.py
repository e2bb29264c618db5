"""Whether the outputs the probes compare depend on the attention at all.

A probe passes when the edited run leaves the outputs where they were. Where the
attention's result never reaches them (an output projection initialised to zero, as
diffusion U-Nets' `zero_module` and DiT's adaLN-Zero start; a gate at zero), every
deviation is 0 whatever the attention does, and a pass says nothing about it. One
traced run adds noise to the output of every attention op (its context: SDPA's, flash
attention's, the attention weights times V); where no compared output moves, the
passes are inconclusive. Where the run finds no attention op, nothing is said.
"""

from typing import Any

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .subject import Subject
from .tree import pick

_ATTENTION = (_ops.ATTENTION, _ops.FLASH)
_SOFTMAX = frozenset(("softmax", "_softmax"))
# Ops that keep attention weights attention weights: masking, dropout, casts, views.
_FOLLOW = (_ops.SAME, _ops.BINARY, _ops.VIEW, _ops.LAYOUT, _ops.INDEX)


class _Noise:
    """An observer that adds noise of its own scale to each attention op's output, in
    place (a private copy's forward, under no_grad). An attention op is SDPA, flash
    attention, or a product that reads softmax weights (followed through masking,
    dropout, casts and views), whatever the trace names its tensors."""

    def __init__(self, generator: torch.Generator) -> None:
        self.session: Any = None  # the session it observes, set once it is open
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
        reads = any(
            isinstance(a, torch.Tensor) and a in self.weights for a in (*args, *kwargs.values())
        )
        if op in _SOFTMAX or (reads and family in _FOLLOW):
            self.weights[first] = True
            return
        meta = self.session.metas.get(first) if self.session is not None else None
        role = meta.role if meta is not None else None
        attention = family in _ATTENTION or (reads and family == _ops.PRODUCT)
        if (attention or role == "context") and first.numel():
            self._shake(first)

    def _shake(self, t: torch.Tensor) -> None:
        finite = t[torch.isfinite(t)]
        scale = float(finite.abs().max()) if finite.numel() else 1.0
        noise = torch.randn(t.shape, generator=self.generator, dtype=torch.float64)
        t.add_(noise.to(t.dtype).to(t.device) * (scale or 1.0))
        self.hits += 1


def deaf(s: Subject) -> str:
    """Why the compared outputs do not depend on the attention ("" where they do, or
    where no attention op was found to test it with)."""
    import warnings

    from .. import _config
    from .._errors import ShapeWarning
    from .._trace.tracing import tracing
    from .._tracer import Trace

    leaves = [leaf for leaf in s.layout.outputs if leaf.path in s.refs]
    if not leaves:
        return ""
    args, kwargs = s.inputs
    noise = _Noise(torch.Generator().manual_seed(0))
    with _config.forced_on(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with tracing(Trace(mode="warn"), s.model, args, kwargs) as session:
            noise.session = session
            with session.observe(noise):
                out = s.model(*args, **kwargs)
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
