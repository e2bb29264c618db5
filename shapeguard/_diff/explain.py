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


def name_difference(pair: Pair) -> Difference | None:
    """The one difference of KINDS that explains `pair`, or None when none does.

    Bounded: each kind is tried at most a few ways on the tensors given; nothing is
    kept of them afterwards.
    """
    return None
