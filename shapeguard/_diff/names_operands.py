"""The query-key product's operands in the other order: the port computes k·qᵀ where the
reference computes q·kᵀ, so each query's row of scores is a key's column.

Read from the site's own operands, never from the scores alone: a causal mask keeps one
triangle of the scores, and the transpose moves them across it, so the masked scores of
the two sides share only the diagonal. At Q or K (the port's product seen, its first
operand taken as Q), the port's operands are the reference's swapped: port Q == ref K and
port K == ref Q. At the scores (the port's product not seen: an einsum), the reference's
own Q and K make its scores up to one scale, fitted and confirmed on every key its mask
leaves, and the same product transposed, at that scale, makes the port's scores on every
key the port's mask leaves, the masks the same. Bounded: two comparisons at Q or K; one
product, one least-squares scale and three comparisons at the scores.
"""

from collections.abc import Sequence
from typing import Any

from .fit import Fit, axis_word, matches, residual

# Below this a score is a mask's fill (finfo.min, -inf), not a score (as names_mask reads it).
FILLED = -1e30
HINT = (
    "swap the operands of the port's query-key product{where}: q @ k.transpose(-2, -1) "
    "(einsum 'bhid,bhjd->bhij'), not k @ q.transpose(-2, -1) ('bhid,bhjd->bhji'), so "
    "that each query's row of scores runs over the keys"
)


def operand_fits(
    ref: Any,
    port: Any,
    role: str | None,
    axes: Sequence[str | None],
    site: dict,
    tol: tuple,
) -> list[Fit]:
    """`site` holds the same attention site's other tensors by role, (ref, port) each, the
    port's None where the port made none the capture could read."""
    if role in ("Q", "K"):
        return _swapped(ref, port, role, axes, site, tol)
    if role == "scores":
        return _transposed_product(ref, port, axes, site, tol)
    return []


def _swapped(ref, port, role: str, axes, site: dict, tol) -> list[Fit]:
    other = "K" if role == "Q" else "Q"
    ref_other, port_other = site.get(other, (None, None))
    if ref_other is None or port_other is None:
        return []
    if not (tuple(ref_other.shape) == tuple(ref.shape) == tuple(port_other.shape)):
        return []
    if matches(ref_other, ref, *tol):
        return []  # Q and K the same tensor: their order is not seen
    if not (matches(ref_other, port, *tol) and matches(ref, port_other, *tol)):
        return []
    q_axis, d_axis = axis_word(axes, ref.dim() - 2), axis_word(axes, ref.dim() - 1)
    return [
        Fit(
            "transpose",
            f"the port's query-key product takes its operands in the other order: port Q == "
            f"ref K and port K == ref Q (sizes {tuple(ref.shape)}, axes (..., {q_axis}, {d_axis})), so "
            "its scores (k·qᵀ) are the reference's (q·kᵀ) transposed over (query, key)",
            HINT.format(where=" on its line"),
            {"swapped": ("Q", "K"), "at": role},
            max(residual(ref_other, port), residual(ref, port_other)),
        )
    ]


def _transposed_product(ref, port, axes, site: dict, tol) -> list[Fit]:
    q, k = site.get("Q", (None, None))[0], site.get("K", (None, None))[0]
    if q is None or k is None or ref.dim() < 2 or tuple(ref.shape) != tuple(port.shape):
        return []
    if ref.shape[-1] != ref.shape[-2] or q.dim() != ref.dim() or k.dim() != ref.dim():
        return []
    try:
        raw = (q.double() @ k.double().transpose(-2, -1)).expand(ref.shape)
    except RuntimeError:
        return []  # the operands do not make these scores
    r, p = ref.double(), port.double()
    known = r > FILLED
    if not bool((known == (p > FILLED)).all()) or not bool(known.any()):
        return []  # another mask too: not one difference
    energy = float((raw[known] ** 2).sum())
    if energy == 0.0:
        return []
    c = float((raw[known] * r[known]).sum()) / energy
    if not matches(c * raw[known], r[known], *tol):
        return []  # the reference's scores are not this product: no claim
    flipped = c * raw.transpose(-2, -1)
    if matches(c * raw[known], p[known], *tol) or not matches(flipped[known], p[known], *tol):
        return []
    q_axis, k_axis = axis_word(axes, ref.dim() - 2), axis_word(axes, ref.dim() - 1)
    return [
        Fit(
            "transpose",
            f"port scores == (ref Q · ref Kᵀ)ᵀ * {c:.6g} wherever the mask leaves a key: the "
            f"port's query-key product takes its operands in the other order (k·qᵀ), its "
            f"scores the reference's transposed over ({q_axis}, {k_axis}) (sizes "
            f"{tuple(ref.shape)}) before the mask",
            HINT.format(where=" (the product whose scores the port's line above takes)"),
            {"swapped": ("Q", "K"), "at": "scores", "scale": c},
            residual(flipped[known], p[known]),
        )
    ]
