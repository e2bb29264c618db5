"""Reading a mask's values (small CPU tensors only), and what a row that hides every key
gives, read from the fill value (or the mask's values) and the dtype: the words
`mask_semantics` puts in its messages."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from .._names import axes as _axes
from . import is_tensor

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    import torch


_MAX_VALUES = 1 << 24


# -- reading values ------------------------------------------------------------------
def has_shape(value) -> TypeGuard["torch.Tensor"]:  # what torch dispatches: a tensor
    return is_tensor(value)


def readable(t) -> TypeGuard["torch.Tensor"]:
    """A plain CPU tensor small enough to read: never meta, fake or on an accelerator."""
    return (
        hasattr(t, "device")
        and type(t).__name__ in ("Tensor", "Parameter", "Buffer")
        and t.device.type == "cpu"
        and t.numel() <= _MAX_VALUES
    )


def scalar_of(value) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hasattr(value, "numel") and value.numel() == 1 and readable(value):
        return float(value.detach().reshape(()).item())
    return None


def aligned(hidden, ndim: int):
    """`hidden` with leading size-1 axes, so it lines up with a target of `ndim` axes."""
    while hidden.dim() < ndim:
        hidden = hidden.unsqueeze(0)
    return hidden


def broadcasts_to(shape, target) -> bool:
    return len(shape) <= len(target) and _axes.broadcast_shapes(tuple(shape), target) == target


# -- what a row that hides every key gives (measured on torch 2.13, CPU) -------------------
@dataclass(frozen=True, slots=True)
class _Texts:
    nan: str  # every key of the row is -inf
    even: str  # every key of the row gets the same logit
    weight: str  # finite logits that differ: the weight goes to hidden keys by score


_SOFTMAX = _Texts(
    "softmax gives NaN there",
    "softmax spreads those rows evenly over every key, hidden ones included",
    "softmax puts all of those rows' weight on hidden keys",
)
# Bool all-False rows and float all--inf rows: zeros, on the math and the CPU flash kernel.
SDPA_TEXTS = _Texts(
    "SDPA returns zeros for them",
    "SDPA spreads those rows evenly over every key, hidden ones included (each gives the "
    "mean of V)",
    "SDPA puts all of those rows' weight on hidden keys",
)
_MHA = "nn.MultiheadAttention"
# need_weights=True computes softmax itself (NaN); need_weights=False calls SDPA (zeros).
_MHA_WEIGHTS = _Texts(
    f"{_MHA} returns NaN for them",
    f"{_MHA} spreads those rows evenly over every key, hidden ones included",
    f"{_MHA} puts all of those rows' weight on hidden keys",
)
_MHA_SDPA = _Texts(f"{_MHA} returns zeros for them", _MHA_WEIGHTS.even, _MHA_WEIGHTS.weight)
# A row of one value m with m + _ABSORBED == m swallows every score below _ABSORBED in
# magnitude, so the logits are equal (finfo.min of float32 or bfloat16). A smaller m
# (-1e4; float16's min once SDPA adds it in float32) only shifts the row, which softmax
# ignores: the row is weighted by its scores, as if unmasked.
_ABSORBED = 1024.0


def _in_dtype(value: float, dtype) -> float:
    """`value` as a tensor of `dtype` holds it: -1e9 is -inf in float16."""
    import torch

    if not dtype.is_floating_point:
        return value
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def result_type(a, b):
    import torch

    return torch.result_type(a, b)


def sdpa_dtype(dtype):
    """The dtype SDPA adds a float mask in on CPU: float32 for float16 and bfloat16."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _row_values(t, target, rows):
    """What `t`, broadcast to `target`, holds in the reported `rows`: [n, seq_k]."""
    return aligned(t, len(target)).expand(target)[rows]


def _classify(logits, texts: _Texts) -> str:
    """The effect of softmax over `logits` [n, seq_k], the reported rows."""
    import torch

    if bool(torch.isneginf(logits).all(-1).any()):
        return texts.nan
    if bool((logits == logits[:, :1]).all()):
        return texts.even
    return texts.weight


def fill_effect(fill: float, dtype):
    # Every key of the row holds the fill itself.
    text = _SOFTMAX.nan if _in_dtype(fill, dtype) == float("-inf") else _SOFTMAX.even
    return lambda rows: text


def values_effect(mask, target, dtype, texts: _Texts):
    """From the mask's values alone, added to the scores in `dtype`."""
    import torch

    def effect(rows) -> str:
        values = _row_values(mask, target, rows).to(dtype)
        if bool(torch.isneginf(values).all(-1).any()):
            return texts.nan
        first = values[:, :1]
        if bool((values == first).all()) and bool((first + _ABSORBED == first).all()):
            return texts.even
        return texts.weight

    return effect


def additive_effect(scores, mask, target):
    """From the logits themselves when the scores can be read, else from the mask."""

    def effect(rows) -> str:
        if readable(scores):
            logits = _row_values(scores, target, rows) + _row_values(mask, target, rows)
            return _classify(logits, _SOFTMAX)
        return values_effect(mask, target, result_type(scores, mask), _SOFTMAX)(rows)

    return effect


def mha_effect(values: list, target, dtype, need_weights):
    """nn.MultiheadAttention adds its masks to the scores in the query's dtype, bool
    ones as -inf; `values` is filled in by the caller before any row is reported."""
    import torch

    sdpa = need_weights is False
    texts = _MHA_SDPA if sdpa else _MHA_WEIGHTS

    def effect(rows) -> str:
        total = None
        for v in values:
            if str(v.dtype) == "torch.bool":
                v = torch.zeros(v.shape, dtype=dtype).masked_fill(v, float("-inf"))
            total = v.to(dtype) if total is None else total + v.to(dtype)
        return values_effect(total, target, sdpa_dtype(dtype) if sdpa else dtype, texts)(rows)

    return effect
