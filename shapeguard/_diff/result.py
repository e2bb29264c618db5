"""What `shapeguard.diff` returns: `.agree`, `.first` (the first divergence or None),
`.matched` (the weights), printed as the report in the house format and as JSON
(docs/json-schema.md, "diff")."""

import json
from dataclasses import dataclass, field
from typing import Any

from .explain import Difference
from .weights import Matched

SCHEMA = "shapeguard.diff/1"


@dataclass(slots=True)
class Side:
    """One side of a divergent pair: the module path as that side names it, the user's
    line that made the tensor, its shape and dtype."""

    path: str
    site: str
    source: str
    shape: list[int]
    dtype: str

    def as_json(self) -> dict:
        return {
            "path": self.path,
            "site": self.site,
            "source": self.source,
            "shape": self.shape,
            "dtype": self.dtype,
        }


@dataclass(slots=True)
class Divergence:
    """The first aligned pair beyond tolerance, with where it diverges along each axis."""

    key: str
    role: str
    ref: Side
    port: Side
    max_error: float
    bad: int
    total: int
    atol: float
    rtol: float
    axes: list[dict]  # per axis: axis, name, size, diverging, runs ("0-3, 5")
    upstream: list[str]  # the agreeing pairs just before it, nearest first
    difference: Difference | None = None
    position: int = 0  # its place among the aligned pairs, from 1

    def relation(self) -> str:
        if self.difference is not None:
            return self.difference.relation
        if self.ref.shape != self.port.shape:
            return (
                f"{self.key}: port {self.port.shape} != reference {self.ref.shape}, "
                f"the same {self.total} elements in another layout"
            )
        return (
            f"{self.key}: port != reference in {self.bad} of {self.total} elements "
            f"beyond tolerance (atol {self.atol:g}, rtol {self.rtol:g}), "
            f"largest |port - ref| {self.max_error:.3g}"
        )

    def along(self) -> str:
        parts = []
        for axis in self.axes:
            name = axis["name"] or f"axis {axis['axis']}"
            parts.append(f"{name} {axis['runs'] or '-'} of {axis['size']}")
        return ", ".join(parts)

    def as_json(self) -> dict:
        diff = self.difference
        return {
            "key": self.key,
            "role": self.role,
            "position": self.position,
            "ref": self.ref.as_json(),
            "port": self.port.as_json(),
            "max_error": _finite(self.max_error),
            "beyond_tolerance": self.bad,
            "elements": self.total,
            "atol": self.atol,
            "rtol": self.rtol,
            "axes": self.axes,
            "upstream": self.upstream,
            "difference": None
            if diff is None
            else {
                "kind": diff.kind,
                "relation": diff.relation,
                "hint": diff.hint,
                "detail": dict(diff.detail),
                "residual": diff.residual,
            },
        }


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


@dataclass(slots=True)
class DiffResult:
    """A comparison of a reference and a port (two models, two backends or two dtypes).

    Attributes:
        agree: True when every aligned tensor is within tolerance.
        first: the first divergence in the reference's order, or None.
        matched: the weights copied (`weights.Matched`).
    """

    ref_name: str
    port_name: str
    first: Divergence | None
    matched: Matched
    compared: int  # aligned pairs compared
    aligned: int  # aligned pairs in all
    ref_only: list[str] = field(default_factory=list)
    port_only: list[str] = field(default_factory=list)
    incomparable: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # over the memory bounds
    largest: float = 0.0  # the largest error of an agreeing pair, as a fraction of tolerance
    tolerance: tuple[float, float] = (0.0, 0.0)
    notes: list[str] = field(default_factory=list)
    flows: dict[str, Any] = field(default_factory=dict)  # for the HTML report: keys per side

    @property
    def agree(self) -> bool:
        return self.first is None

    def __str__(self) -> str:
        return render(self)

    def as_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "ref": self.ref_name,
            "port": self.port_name,
            "agree": self.agree,
            "first": None if self.first is None else self.first.as_json(),
            "aligned": self.aligned,
            "compared": self.compared,
            "ref_only": self.ref_only,
            "port_only": self.port_only,
            "incomparable": self.incomparable,
            "skipped": self.skipped,
            "largest_agreeing_error_to_tolerance": self.largest,
            "tolerance": {"atol": self.tolerance[0], "rtol": self.tolerance[1]},
            "weights": self.matched.as_json(),
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2)


def render(result: DiffResult) -> str:
    """The report: the relation first, then where on both sides, the operands, the hint."""
    lines = []
    first = result.first
    who = f"{result.port_name} against {result.ref_name}"
    if first is None:
        atol, rtol = result.tolerance
        lines.append(
            f"diff: {who} agree: {result.compared} aligned tensors within tolerance "
            f"(atol {atol:g}, rtol {rtol:g}); the largest error is {result.largest:.2g} of "
            "the tolerance where it occurs"
        )
    else:
        lines.append(f"diff: {first.relation()}")
        lines.append(
            f"  first divergence: {first.key} ({first.position} of {result.aligned} aligned "
            f"tensors, {who}; the {first.position - 1} before it agree)"
        )
        if first.axes:
            lines.append(f"  diverging along: {first.along()}")
        for label, side in (("reference", first.ref), ("port", first.port)):
            lines.append(f"  {label:9} {side.path or '(root)'}  {side.site}  {side.source}")
        lines.append(
            f"  operands: reference {first.role} {first.ref.shape} {first.ref.dtype}, "
            f"port {first.role} {first.port.shape} {first.port.dtype}"
        )
        if first.upstream:
            lines.append(f"  agreeing just before: {', '.join(first.upstream[:3])}")
        lines.append(f"  hint: {_hint(first)}")
    lines.append(
        f"  aligned {result.aligned}; reference only {len(result.ref_only)}, port only "
        f"{len(result.port_only)}, different element counts {len(result.incomparable)}"
        + (f", over the memory bound {len(result.skipped)}" if result.skipped else "")
    )
    lines.append(f"  {result.matched.summary()}")
    lines.extend(f"  note: {note}" for note in result.notes)
    return "\n".join(lines) + "\n"


def _hint(first: Divergence) -> str:
    if first.difference is not None:
        return first.difference.hint
    if first.upstream:
        return (
            f"no single transformation of the catalogue explains it; {first.upstream[0]} "
            f"still agrees, so compare how each side makes {first.role} from it, "
            f"at the two lines above"
        )
    return "no single transformation of the catalogue explains it; compare the two lines above"
