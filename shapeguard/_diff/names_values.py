"""Differences in values at the same places: a constant scale, a dropped bias.

Bounded: one least-squares ratio and one mean offset over the tensor, each checked by one
comparison; the scale's reading tries the four usual scale mistakes on the named sizes.
"""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .fit import Fit, axis_word, matches, residual, row_scale

# The fewest elements a constant ratio is claimed over.
FEWEST = 4
# A scale mistake (the port's scale for the reference's), the port's factor over the reference's from head_dim (D) and
# d_model (C), and the fix.
MISTAKES = (
    ("1/sqrt(d_model) for 1/sqrt(head_dim)", lambda D, C: math.sqrt(D / C),
     "divide by sqrt(head_dim), not sqrt(d_model)"),
    ("1/sqrt(head_dim) for 1/sqrt(d_model)", lambda D, C: math.sqrt(C / D),
     "divide by sqrt(d_model), not sqrt(head_dim)"),
    ("1/head_dim (divided by head_dim, or scaled twice) for 1/sqrt(head_dim)",
     lambda D, C: 1 / math.sqrt(D), "scale once by head_dim ** -0.5"),
    ("no scale for 1/sqrt(head_dim)", lambda D, C: math.sqrt(D),
     "scale by head_dim ** -0.5"),
)  # fmt: skip


def value_fits(
    ref: Any, port: Any, axes: Sequence[str | None], sizes: Mapping[str, int], tol: tuple
) -> list[Fit]:
    if ref.shape != port.shape or ref.numel() == 0:
        return []
    return [
        *_scale(ref, port, sizes, tol),
        *_scale_before_softmax(ref, port, sizes, tol),
        *_bias(ref, port, axes, tol),
    ]


def _named(ratio: float, sizes: Mapping[str, int]) -> list[tuple[str, str]]:
    D, C = sizes.get("head_dim"), sizes.get("d_model")
    if not D or not C:
        return []
    return [
        (said, fix)
        for said, factor, fix in MISTAKES
        if math.isclose(factor(D, C), ratio, rel_tol=1e-4)
    ]


def _scale(ref, port, sizes, tol) -> list[Fit]:
    r, p = ref.double(), port.double()
    if not bool(r.isfinite().all() and p.isfinite().all()):
        return []
    if r.numel() < FEWEST or bool((r == r.reshape(-1)[0]).all()):
        return []  # a ratio of a few numbers, or of a constant, is no evidence
    energy = float((r * r).sum())
    if energy == 0.0:
        return []
    ratio = float((r * p).sum()) / energy
    if ratio == 0.0 or math.isclose(ratio, 1.0, rel_tol=1e-6):
        return []
    if not matches(ref * ratio, port, *tol):
        return []
    readings = _named(ratio, sizes)
    reading, fix = readings[0] if len(readings) == 1 else ("", "")
    if reading:
        said = f": the port scales by {reading}"
    elif readings:  # the sizes make two mistakes the same number: name neither
        said = f" ({' or '.join(r for r, _ in readings)} at these sizes)"
    else:
        said = ""
    return [
        Fit(
            "scale",
            f"port == ref * {ratio:.6g} everywhere, a constant ratio{said}",
            f"multiply the port's scale by {1 / ratio:.6g} on the line that scales it"
            + (f" ({fix})" if fix else ""),
            {"ratio": ratio, "reading": reading or None},
            residual(ref * ratio, port),
        )
    ]


def _probabilities(t, tol) -> bool:
    t = t.double()
    return bool((t >= 0).all()) and matches(t.sum(-1), torch.ones_like(t.sum(-1)), *tol)


def _scale_before_softmax(ref, port, sizes, tol) -> list[Fit]:
    """port == softmax(c * scores) where ref == softmax(scores), read on the probabilities
    alone: log ref is the scores up to an offset per row, which a softmax forgets."""
    if ref.dim() < 1 or ref.shape[-1] < 2 or ref.numel() < FEWEST:
        return []
    if not (_probabilities(ref, tol) and _probabilities(port, tol)):
        return []
    visible = ref > 0
    if not bool((visible == (port > 0)).all()):
        return []  # another mask, not another scale
    logits = ref.double().clamp_min(1e-300).log()
    c = row_scale(logits, port.double().clamp_min(1e-300).log(), visible)
    if c is None or c <= 0.0 or math.isclose(c, 1.0, rel_tol=1e-6):
        return []
    predicted = torch.softmax((c * logits).masked_fill(~visible, float("-inf")), dim=-1)
    if not matches(predicted, port, *tol):
        return []
    readings = _named(c, sizes)
    reading, fix = readings[0] if len(readings) == 1 else ("", "")
    said = f": the port scales by {reading}" if reading else ""
    return [
        Fit(
            "scale",
            f"port == softmax(scores * {c:.6g}) where ref == softmax(scores): the scores "
            f"before the softmax differ by a constant ratio{said}",
            f"multiply the port's scale by {1 / c:.6g} on the line that scales its scores"
            + (f" ({fix})" if fix else ""),
            {"ratio": c, "reading": reading or None, "before": "softmax"},
            residual(predicted, port),
        )
    ]


def _bias(ref, port, axes, tol) -> list[Fit]:
    """port == ref + b, with b a vector over the last axis, the same at every other index."""
    if ref.dim() < 2 or ref.numel() == ref.shape[-1]:
        return []
    delta = (port.double() - ref.double()).reshape(-1, ref.shape[-1])
    if not bool(delta.isfinite().all()):
        return []
    b = delta.mean(0)
    if not matches(ref.double() + b, port.double(), *tol):
        return []
    if matches(ref.double(), port.double(), *tol) or float(b.abs().max()) == 0.0:
        return []
    last = ref.dim() - 1
    feature = axis_word(axes, last)
    others = ", ".join(axis_word(axes, i) for i in range(last))
    return [
        Fit(
            "bias",
            f"port == ref + b, b a vector over {feature} ({ref.shape[-1]}) the same at every "
            f"{others} (largest |b| {float(b.abs().max()):.3g}): a bias one side adds and the "
            "other does not",
            "the port's projection drops the reference's bias (nn.Linear(..., bias=False), or "
            "F.linear without its bias), or adds one the reference lacks: match its bias",
            {"axis": last, "largest": float(b.abs().max())},
            residual(ref.double() + b, port.double()),
        )
    ]
