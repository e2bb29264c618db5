"""Masks: the other polarity (the port attends where the reference masks), or the other
axis (the port's mask over (k_seq, q_seq) where the reference's is over (q_seq, k_seq)).

Read on attention probabilities with the agreeing scores upstream, never on a mask alone
(a boolean mask's polarity is the convention in question). The reference's visible keys
are where its probabilities are positive, and only if a softmax of the scores over them
reproduces the reference (their scale fitted, as the scores may be read before they are
scaled); each candidate mask must then reproduce the port's
probabilities on every row it leaves a key in (a row it empties is a NaN or a uniform row,
by the port's fill; those are not compared, and at least half the rows must be).
Bounded: one softmax to confirm and one per candidate (two) per upstream scores pair (at
most MOST_UPSTREAM).
"""

from collections.abc import Sequence
from typing import Any

import torch

from .fit import Fit, axis_word, matches, residual, row_scale

MOST_UPSTREAM = 4


def _softmax_over(scores, visible):
    return torch.softmax(scores.double().masked_fill(~visible, float("-inf")), dim=-1)


# Below this a score is a mask's fill (finfo.min, -inf), not a score.
FILLED = -1e30


def _known_scores(pair, tol):
    """The scores where either side has one: a side's softmax input may hold its own mask's
    fill where the other still has the score (they must agree where both have one)."""
    r = pair.ref.double()
    if tuple(pair.port.shape) != tuple(r.shape):
        return r, r > FILLED
    p = pair.port.double()
    known_r, known_p = r > FILLED, p > FILLED
    both = known_r & known_p
    if not matches(r[both], p[both], *tol):
        return r, known_r
    return torch.where(known_r, r, p), known_r | known_p


def mask_fits(ref: Any, port: Any, axes: Sequence[str | None], upstream, tol: tuple) -> list[Fit]:
    if ref.dim() < 2 or ref.shape != port.shape or ref.shape[-1] != ref.shape[-2]:
        return []
    q_name, k_name = axis_word(axes, ref.dim() - 2), axis_word(axes, ref.dim() - 1)
    fits = []
    for pair in [p for p in upstream if tuple(p.ref.shape) == tuple(ref.shape)][:MOST_UPSTREAM]:
        visible = ref > 0
        raw, known = _known_scores(pair, tol)
        if not bool(visible.any(-1).all()) or not bool(known[visible].all()):
            continue
        # The scores may be upstream of their scale (a product scaled after): the scale
        # is fitted from the reference, then must reproduce it.
        c = row_scale(raw.masked_fill(~known, 0.0), ref.double().clamp_min(1e-300).log(), visible)
        if c is None or not matches(_softmax_over(c * raw, visible), ref, *tol):
            continue
        scores = c * raw
        candidates = {
            "mask_polarity": (
                ~visible,
                f"the port attends where the reference masks and masks where it attends: "
                f"its mask over ({q_name}, {k_name}) has the other polarity",
                "invert the port's mask (~mask): a boolean mask is True where attention is "
                "allowed for scaled_dot_product_attention and True where it is hidden for "
                "masked_fill; an additive mask puts -inf where keys are hidden",
            ),
            "mask_axis": (
                visible.transpose(-1, -2),
                f"the port's mask is the reference's transposed: it lets query i see key j "
                f"where the reference lets query j see key i (a mask over ({k_name}, "
                f"{q_name}) used as ({q_name}, {k_name}))",
                "transpose the port's mask (.mT), or swap its comparison: tril for triu, "
                "i >= j for i <= j",
            ),
        }
        for kind, (mask, relation, hint) in candidates.items():
            rows = mask.any(-1)
            if bool((mask == visible).all()) or 2 * int(rows.sum()) < rows.numel():
                continue
            if not bool(known[mask].all()):
                continue  # a key the candidate shows has no score on either side
            predicted = _softmax_over(scores, mask)[rows]
            if not matches(predicted, port.double()[rows], *tol):
                continue
            left = rows.numel() - int(rows.sum())
            said = f" ({left} rows the port's mask empties not compared)" if left else ""
            fits.append(
                Fit(kind, relation + said, hint, {"rows_left": left},
                    residual(predicted, port.double()[rows]))
            )  # fmt: skip
    return fits
