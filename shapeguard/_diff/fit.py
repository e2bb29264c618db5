"""What the families of named differences share: a candidate explanation (`Fit`), whether a
transformed tensor matches the port's within the pair's tolerance, and axis words.

A family module (`names_*.py`) tries its kinds on one pair and returns the `Fit`s that
explain it; `explain.name_difference` keeps the one, or says nothing.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SAMPLE = 257
# The names an axis of positions and the per-head feature axis go by, in shapeguard's dims
# and in the diff engine's roles (an SDPA operand's `query`/`key`).
SEQ_AXES = ("seq", "query", "key", "q_seq", "k_seq", "seq_q", "seq_k")
HEAD_DIM_AXES = ("head_dim", "d_k")


@dataclass(frozen=True, slots=True)
class Fit:
    """One kind that explains a pair: port == transform(ref) within tolerance.

    `move` is the transform itself where it only moves elements (a permutation of ref's
    elements), so two kinds that name the same move are told apart from two moves.
    """

    kind: str
    relation: str
    hint: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    residual: float = 0.0
    move: Callable[[Any], Any] | None = None


def residual(predicted: Any, port: Any) -> float:
    """The largest absolute error of `predicted` against `port`; inf where they cannot agree."""
    if tuple(predicted.shape) != tuple(port.shape):
        return float("inf")
    if predicted.numel() == 0:
        return 0.0
    a, b = predicted.double(), port.double()
    if not bool((a.isfinite() == b.isfinite()).all()):
        return float("inf")
    finite = a.isfinite()
    return float((a - b).abs()[finite].max()) if bool(finite.any()) else 0.0


def matches(predicted: Any, port: Any, atol: float, rtol: float) -> bool:
    """`predicted` agrees with `port` element by element (torch.allclose's rule, NaN == NaN)."""
    if tuple(predicted.shape) != tuple(port.shape):
        return False
    import torch

    a, b = predicted.reshape(-1), port.reshape(-1)
    if a.numel() > SAMPLE:  # most candidates fail: a spread sample rejects them cheaply
        at = torch.linspace(0, a.numel() - 1, SAMPLE).long()
        if not torch.allclose(a[at].double(), b[at].double(), rtol, atol, equal_nan=True):
            return False
    return bool(torch.allclose(a.double(), b.double(), rtol, atol, equal_nan=True))


def axis_word(axes: Sequence[str | None], i: int) -> str:
    """The axis' name where provenance gave one, else its position."""
    name = axes[i] if i < len(axes) else None
    return name if name else f"axis {i}"


def axis_index(axes: Sequence[str | None], *names: str) -> int | None:
    """The position of the first of `names` among the named axes, or None."""
    for name in names:
        if name in axes:
            return list(axes).index(name)
    return None


def row_scale(x: Any, y: Any, visible: Any) -> float | None:
    """The c with y == c * x + a_row on the visible entries (least squares over every row,
    an offset per row: what a softmax forgets), or None where x is constant on every row."""
    x = x.double().masked_fill(~visible, 0.0)
    y = y.double().masked_fill(~visible, 0.0)
    n = visible.sum(-1, keepdim=True).clamp_min(1)
    xc = (x - x.sum(-1, keepdim=True) / n).masked_fill(~visible, 0.0)
    yc = (y - y.sum(-1, keepdim=True) / n).masked_fill(~visible, 0.0)
    energy = float((xc * xc).sum())
    return float((xc * yc).sum()) / energy if energy > 0.0 else None
