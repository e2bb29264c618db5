"""Compare two flows: align their tensors by key, find the first pair (in the reference's
order) beyond tolerance, and say where along each named axis it diverges.

Tolerance follows the less precise dtype of the pair: a pair diverges where some element
has |port - ref| > atol + rtol * (|ref| + median |ref|), so an element near zero in a tensor
of large values is held to the tensor's scale, not to zero (the median, so that a mask's
fill does not set that scale). The numbers (TOLERANCES) were
measured on tiny transformers decoders, eager against SDPA (float32: largest error 2e-7
on logits of size 1) and float32 against bfloat16 (errors up to 3e-2 after two layers).
"""

from dataclasses import dataclass, field
from typing import Any

from .capture import Captured, Flow

# dtype -> (atol, rtol). float64 and float32 tight, the 16-bit floats loose.
TOLERANCES = {
    "float64": (1e-8, 1e-6),
    "float32": (1e-5, 1e-4),
    "float16": (1e-2, 5e-2),
    "bfloat16": (5e-2, 1e-1),
}
# How many agreeing pairs before a divergence are kept as its upstream.
UPSTREAM = 6
# How many index runs an axis' extent lists before "...".
RUNS = 4


def tolerance(*dtypes: str) -> tuple[float, float]:
    """The (atol, rtol) of the least precise of `dtypes` (an unknown one: float32's)."""
    known = [TOLERANCES.get(d, TOLERANCES["float32"]) for d in dtypes]
    return max(known, default=TOLERANCES["float32"])


@dataclass(slots=True)
class Measured:
    """One aligned pair compared: the largest error, where it is beyond tolerance."""

    key: str
    max_error: float
    bad: int  # elements beyond tolerance (the count of all when the shapes differ)
    total: int
    atol: float
    rtol: float
    same_shape: bool
    ratio: float = 0.0  # the largest error as a fraction of what tolerance allows there
    floor: float = 0.0  # values at or below -floor on both sides are a mask's fill
    skip: Any = None  # elements not compared (padded positions), broadcast to the pair

    @property
    def agrees(self) -> bool:
        return self.bad == 0


@dataclass(slots=True)
class Alignment:
    """The keys both flows have (in the reference's order), and each side's own."""

    common: list[str] = field(default_factory=list)
    ref_only: list[str] = field(default_factory=list)
    port_only: list[str] = field(default_factory=list)
    incomparable: list[str] = field(default_factory=list)  # element counts differ


def align(ref: Flow, port: Flow) -> Alignment:
    out = Alignment()
    for key, captured in ref.tensors.items():
        other = port.tensors.get(key)
        if other is None:
            out.ref_only.append(key)
        elif other.values.numel() != captured.values.numel():
            out.incomparable.append(key)
        else:
            out.common.append(key)
    out.port_only = [k for k in port.tensors if k not in ref.tensors]
    return out


def flow_tolerance(ref: Flow, port: Flow) -> tuple[float, float]:
    """The tolerance the flows' pairs are held to, at the least: their models' dtypes'."""
    dtypes = [c.dtype for c in (*ref.tensors.values(), *port.tensors.values())]
    return tolerance(*dtypes, *(d for d in (ref.model_dtype, port.model_dtype) if d))


def measure(ref: Captured, port: Captured, *model_dtypes: str, skip: Any = None) -> Measured:
    """Compare one pair at the tolerance of its dtypes and the models' (`Flow.model_dtype`).
    Pairs whose shapes differ (same element count: a transposed layout) diverge as a whole.
    `skip` marks elements not compared (padded positions, `padding.skipped`)."""
    atol, rtol = tolerance(ref.dtype, port.dtype, *(d for d in model_dtypes if d))
    a, b = ref.values, port.values
    total = a.numel()
    if a.shape != b.shape:
        return Measured(ref.key, float("inf"), total, total, atol, rtol, False)
    floor = _floor(ref.dtype, port.dtype, *model_dtypes)
    bad_mask, error, ratio = _beyond(a, b, atol, rtol, floor, skip)
    max_error = float(error.max()) if total else 0.0
    worst = float(ratio.max()) if total else 0.0
    bad = int(bad_mask.sum())
    return Measured(ref.key, max_error, bad, total, atol, rtol, True, worst, floor, skip)


def _beyond(a, b, atol: float, rtol: float, floor: float, skip=None) -> tuple[Any, Any, Any]:
    """(beyond tolerance, |b - a|, |b - a| / allowed) per element; two values both at or
    below -floor (half the narrowest dtype's largest value) are the same mask's fill, and
    the elements `skip` marks are not compared."""
    import torch

    if skip is not None:
        b = torch.where(skip, a, b)
    error = (b - a).abs()
    finite = a.isfinite()
    # The median magnitude, not the mean: a mask's fill (the dtype's minimum, -1e9) in
    # the scores would make every unmasked element's tolerance huge.
    scale = a[finite].abs().median() if bool(finite.any()) else torch.tensor(0.0)
    allowed = atol + rtol * (a.abs() + scale)
    # NaN or inf on one side only is a divergence; the same non-finite value on both is not,
    # nor a mask's fill at each side's floor (float16's -65504 against float32's -3.4e38).
    same = (a == b) | (a.isnan() & b.isnan()) | ((a <= -floor) & (b <= -floor))
    bad = ~same & ~(error <= allowed)
    ratio = torch.where(same, torch.zeros_like(error), error / allowed).nan_to_num(nan=float("inf"))
    return bad, error.nan_to_num(nan=float("inf")), ratio


def _floor(*dtypes: str) -> float:
    import torch

    known = [torch.finfo(getattr(torch, d)).max for d in dtypes if d in TOLERANCES]
    return 0.5 * min(known, default=torch.finfo(torch.float32).max)


def extent(ref: Captured, port: Captured, measured: Measured) -> list[dict]:
    """Per axis of the reference's tensor: which indices hold an element beyond tolerance,
    as runs ("0-3, 5"), with the axis' name where the op's contract gave one."""
    if not measured.same_shape:
        return []
    bad, _, _ = _beyond(
        ref.values, port.values, measured.atol, measured.rtol, measured.floor, measured.skip
    )
    axes = []
    for i, size in enumerate(bad.shape):
        others = [d for d in range(bad.dim()) if d != i]
        hit = bad.any(dim=others) if others else bad
        indices = [j for j, flag in enumerate(hit.tolist()) if flag]
        name = ref.axes[i] if i < len(ref.axes) else None
        axes.append(
            {"axis": i, "name": name, "size": int(size), "diverging": len(indices),
             "runs": runs(indices)}
        )  # fmt: skip
    return axes


def runs(indices: list[int]) -> str:
    """`[0, 1, 2, 5]` as "0-2, 5", at most RUNS runs then "..."."""
    parts: list[str] = []
    start = prev = None
    for i in indices:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = i
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts[:RUNS]) + (", ..." if len(parts) > RUNS else "")


@dataclass(slots=True)
class Comparison:
    """The flows compared: every aligned pair measured, up to and including the first
    that diverges (`first`), and the agreeing pairs just before it (`upstream`)."""

    alignment: Alignment
    measured: list[Measured]
    first: Measured | None
    upstream: list[str]


def first_divergence(ref: Flow, port: Flow, padding: Any = None) -> Comparison:
    """`padding`: the positions the inputs establish as padding (`padding.Padding`), or
    None; a pair with axes tied to them (`padding.skipped`) is compared off them."""
    from .padding import skipped

    alignment = align(ref, port)
    measured: list[Measured] = []
    agreed: list[str] = []
    for key in alignment.common:
        a, b = ref.tensors[key], port.tensors[key]
        same = a.values.shape == b.values.shape
        skip = skipped(a, padding) if padding is not None and same else None
        m = measure(a, b, ref.model_dtype, port.model_dtype, skip=skip)
        measured.append(m)
        if not m.agrees:
            return Comparison(alignment, measured, m, agreed[::-1][:UPSTREAM])
        agreed.append(key)
    return Comparison(alignment, measured, None, [])
