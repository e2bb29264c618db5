"""How far an output moved, relative to its scale, and how far it may move."""

import torch

# Relative tolerance on the output's scale: float64 rounding is ~1e-16 per op.
RTOL = {torch.float64: 1e-7, torch.float32: 1e-4}
_DEFAULT_RTOL = 1e-2


def deviation(a: torch.Tensor, b: torch.Tensor, scale: float) -> float:
    """max |a - b| over `scale`; NaN in one place and not the other is infinite."""
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if bool((nan_a != nan_b).any()):
        return float("inf")
    both = ~nan_a
    if not bool(both.any()):
        return 0.0
    diff = (a[both] - b[both]).abs().max().item()
    return diff / scale


def scale_of(out: torch.Tensor) -> float:
    """The largest finite magnitude in `out`: the scale deviations are measured on."""
    finite = out[torch.isfinite(out)]
    if finite.numel() == 0:
        return 1.0
    return max(finite.abs().max().item(), 1e-12)


def rtol_for(dtype) -> float:
    """The tolerance for outputs of this dtype."""
    return RTOL.get(dtype, _DEFAULT_RTOL)
