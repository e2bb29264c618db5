"""How far an output moved, relative to its scale, and how far it may move.

The tolerance comes from the least precise floating dtype the module computes in
(a float64 copy whose norms cast to float32 rounds like float32), relative to the
output's scale: the largest finite magnitude of the compared outputs.
"""

import torch

# Relative tolerance on the output's scale, by the least precise dtype seen: float64
# rounding is ~1e-16 per op, float32 ~1e-7 (1e-4 leaves three orders of magnitude for a
# deep model's accumulated rounding), half precision ~1e-3.
RTOL = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 1e-2,
    torch.bfloat16: 3e-2,
}
_DEFAULT_RTOL = 3e-2


def deviation(a: torch.Tensor, b: torch.Tensor, scale: float, keep=None) -> float:
    """max |a - b| over `scale`, where `keep` (a bool tensor of their shape) is True; NaN
    in one place and not the other is infinite, and so are different shapes."""
    if a.shape != b.shape:
        return float("inf")
    if keep is not None:
        keep = keep.to(a.device)
        if not bool(keep.any()):
            return 0.0
        a, b = a[keep], b[keep]
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if bool((nan_a != nan_b).any()):
        return float("inf")
    both = ~nan_a
    if not bool(both.any()):
        return 0.0
    diff = (a[both].double() - b[both].double()).abs().max().item()
    return diff / scale


def scale_of(out: torch.Tensor, keep=None) -> float:
    """The largest finite magnitude in `out` (where `keep`): deviations are measured on it."""
    if keep is not None and keep.shape == out.shape:
        out = out[keep.to(out.device)]
    finite = out[torch.isfinite(out)]
    if finite.numel() == 0:
        return 1.0
    return max(finite.abs().max().item(), 1e-12)


def rtol_for(dtype) -> float:
    """The tolerance for outputs of this dtype."""
    return RTOL.get(dtype, _DEFAULT_RTOL)


def tolerance(dtypes) -> float:
    """The tolerance for a module that computes in these dtypes: the least precise one's."""
    return max((rtol_for(d) for d in dtypes), default=RTOL[torch.float64])


class DtypeScan:
    """Notes the floating dtypes of every op's outputs: an observer of a session
    (`_trace.opening.run_observed`)."""

    def __init__(self) -> None:
        self.dtypes: set = set()

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        pass

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.dtypes.add(t.dtype)
