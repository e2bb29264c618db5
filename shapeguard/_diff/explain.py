"""Name the difference between two aligned tensors that diverge: the one transformation
of a bounded set that maps the reference's tensor onto the port's.

The seam between the diff engine (which finds the first diverging pair) and the
catalogue of differences (which says what it is). A difference is named only when it
explains the pair within tolerance; otherwise nothing is claimed (None), as everywhere
in shapeguard: a wrong name is worse than none.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Pair:
    """One aligned pair of tensors, the reference's and the port's, and what is known of it.

    `ref` and `port` are detached CPU tensors of the same role (their shapes may differ:
    a transposed layout). `axes` names `ref`'s axes where provenance established them
    (None where not: never guessed from sizes). `upstream` holds the aligned pairs
    that fed this one and still agreed, nearest first (K before rotary for K after
    rotary), so a difference in how a tensor was made from them can be tested.
    `sizes` are named sizes known from the models (heads, head_dim, d_model, ...).
    `site` and `ref_before` are described where they are declared.
    """

    ref: Any
    port: Any
    key: str  # the alignment key, e.g. "layers.3.self_attn K"
    role: str | None = None  # Q, K, V, scores, attn, mask, context, out, block
    axes: tuple[str | None, ...] = ()
    upstream: tuple["Pair", ...] = ()
    sizes: Mapping[str, int] = field(default_factory=dict)
    atol: float = 1e-5
    rtol: float = 1e-4
    # The same attention site's other tensors by role, (ref, port) each (Q's K, the
    # scores' Q and K), the port's None where the capture read none of the port's (an
    # einsum): what an operand order is read from.
    site: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    # The reference's tensors just before this one that the port has no counterpart of
    # (a projection the port computes without running its module), nearest first: read
    # on the reference's side only, as the tensor before rotary.
    ref_before: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Difference:
    """A transformation that explains a diverging pair: port == transform(ref) within
    tolerance. `kind` is one of KINDS; `relation` says it in named axes and sizes (the
    first line of the house message); `hint` is the fix on the port's line; `detail` the
    transformation's parameters (axes, ratio, shift) for the JSON report."""

    kind: str
    relation: str
    hint: str
    detail: Mapping[str, Any] = field(default_factory=dict)
    residual: float = 0.0  # the largest error left after the transformation


KINDS = (
    "transpose",  # an axis permutation or transpose
    "head_grouping",  # heads grouped (h d) in one and (d h) in the other
    "rotary_pairing",  # rotary pairs interleaved (GPT-J) against half-split (NeoX)
    "scale",  # a constant scale ratio, such as sqrt(d_model / d_k)
    "shift",  # a shift by one position
    "reverse",  # a reversed axis
    "roll",  # a rolled axis
    "mask_polarity",  # a mask with the other polarity
    "mask_axis",  # a mask on the other axis
    "bias",  # a dropped (or added) bias
)


# Where two kinds name the same move of elements (heads regrouped when heads == head_dim is
# their transpose; a size-2 axis reversed is it rolled by one), the more specific name.
SPECIFIC_FIRST = ("head_grouping", "reverse")


def name_difference(pair: Pair) -> Difference | None:
    """The one difference of KINDS that explains `pair`, or None when none does, when the
    pair agrees, or when two different transformations explain it (no guess between them).

    Bounded: each family tries its kinds a fixed number of ways (its module says how
    many; at most 120 permutations, every roll of an axis up to 128 long, two rotary fits
    per upstream pair, each followed by at most five tests), each one comparison of tensors the size of the pair; nothing is kept
    of them afterwards.
    """
    from .fit import matches

    ref, port = pair.ref, pair.port
    tol = (pair.atol, pair.rtol)
    # The candidates are wrong on purpose (an inverted mask, a transposed one): call this
    # outside any open trace, or its own checks flag them (a `disabled()` block does not
    # switch off an open session's ops until its next forward).
    if ref.shape == port.shape and matches(ref, port, *tol):
        return None
    fits = _distinct(_all_fits(pair, tol), ref)
    if len(fits) != 1:
        return None
    fit = fits[0]
    return Difference(fit.kind, fit.relation, fit.hint, fit.detail, fit.residual)


def _all_fits(pair: Pair, tol: tuple[float, float]) -> list:
    from .names_layout import layout_fits
    from .names_mask import mask_fits
    from .names_operands import operand_fits
    from .names_rotary import rotary_fits
    from .names_values import value_fits

    ref, port, axes = pair.ref, pair.port, pair.axes
    return [
        *layout_fits(ref, port, axes, pair.sizes, tol),
        *value_fits(ref, port, axes, pair.sizes, tol),
        *rotary_fits(ref, port, axes, pair.upstream, tol, pair.ref_before),
        *mask_fits(ref, port, axes, pair.upstream, tol),
        *operand_fits(ref, port, pair.role, axes, dict(pair.site), tol),
    ]


def _distinct(fits: list, ref: Any) -> list:
    """The fits left when two that move the elements the same way count once."""
    import torch

    def rank(fit: Any) -> int:
        return SPECIFIC_FIRST.index(fit.kind) if fit.kind in SPECIFIC_FIRST else len(KINDS)

    index = torch.arange(ref.numel()).view(ref.shape)
    kept: list = []
    for fit in sorted(fits, key=rank):
        moved = fit.move(index) if fit.move is not None else None
        if moved is not None and any(
            k.move is not None
            and tuple(k.move(index).shape) == tuple(moved.shape)
            and bool((k.move(index) == moved).all())
            for k in kept
        ):
            continue
        kept.append(fit)
    return kept
