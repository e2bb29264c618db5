"""The module under probe: a private copy, its inputs, its reference outputs, and the verdict.

A probe compares outputs leaf by leaf (every floating tensor of the output that has a
batch or token axis the layout knows), on the examples and positions it says, and
never on padded positions: a padded query's output is whatever the module makes of a
row that sees nothing, and no property holds there.
"""

from dataclasses import dataclass, field

import torch

from .._names import axes as _axes
from .compare import deviation, scale_of
from .edits import take
from .graph_layout import Graph
from .layout_records import Layout, OutLeaf, example_rows
from .result import ProbeResult
from .runs import Rejected, call
from .tree import first_output, pick
from .watch import Watch


# weakref_slot: its own memo fields hold it weakly (`prepare.prepare_subject`).
@dataclass(slots=True, weakref_slot=True)
class Subject:
    """A private copy of the module, its inputs, and what the trace found."""

    model: torch.nn.Module
    inputs: tuple  # (args, kwargs)
    layout: Layout
    reference: torch.Tensor  # the first floating output
    out_batch: int | None  # its batch axis
    out_seq: int | None  # its query axis
    watch: Watch
    events: list
    declared: dict
    rtol: float
    generator: torch.Generator
    causal: str = ""
    traced_model: torch.nn.Module | None = None  # the copy the trace ran (its Linears)
    refs: dict = field(default_factory=dict)  # path -> reference output leaf
    findings: list = field(default_factory=list)  # the trace's findings
    distributed: str = ""  # why the module's state is sharded (DTensor), when it is
    # A function giving this subject in the dtype the module was given (the probes run
    # on a float64 copy); a failure there is confirmed as given.
    as_given: object = None
    mismatch: str = ""  # why the last measure was infinite without NaN (shapes differ)
    # For a batch of one: a function giving the subject of the batch grown to two
    # (example 0, then one made like it: `edits.grown`), or why there is none.
    grown: object = None
    # Why no probe proves anything on this module, whatever it measures (outputs that are
    # not finite on the unmodified input, a forward that is not deterministic): every
    # conclusive result is made inconclusive with it (`check._run_probe`).
    void: str = ""
    # Why a failure is no counterexample (the forward draws from the global RNG: runs
    # with the same RNG state draw alike only where the shapes and rows are alike).
    random: str = ""
    # Why the module's causal mask is not about the queries the probes test ("" where it
    # is, or where the module is not causal at all).
    not_causal: str = ""
    # The graph the inputs hold (`graph_layout.Graph`), or why the trace shows none.
    graph: Graph | str | Exception | None = None

    def run(self, inputs, what: str = "") -> torch.Tensor:
        """The first floating output of one forward (`runs.Rejected` if the module raises)."""
        out = first_output(call(self.model, inputs, what))
        if out is None:
            raise Rejected(RuntimeError("the module returned no floating-point tensor"), what)
        return out

    def run_all(self, inputs, what: str = "") -> dict:
        """Every compared output leaf of one forward, by path (`runs.Rejected` if the
        module raises on the inputs: `what` says what the probe did to them)."""
        out = call(self.model, inputs, what)
        found = {}
        for leaf in self.layout.outputs:
            value = pick(out, leaf.path)
            if isinstance(value, torch.Tensor):
                found[leaf.path] = value
        return found

    def outputs(self, *, group: int | None = None, batch: bool = False) -> list[OutLeaf]:
        """The output leaves with an axis of token group `group`, or (`batch`) with a
        batch axis whose examples can be told apart."""
        found = []
        for leaf in self.layout.outputs:
            if leaf.path not in self.refs:
                continue
            if group is not None and group not in leaf.seq.values():
                continue
            if batch and (not (leaf.batch or leaf.folded) or self.unclear(leaf)):
                continue
            if batch and leaf.folded and not leaf.batch and (leaf.seq or self._padded()):
                continue  # an example's padding cannot be placed among folded rows
            found.append(leaf)
        return found

    def _padded(self) -> bool:
        return any(bool(pad.any()) for pad in self.layout.pads.values())

    def unclear(self, leaf: OutLeaf) -> bool:
        """An axis as long as the batch that is not known to be the batch (CLIP's
        texts-by-images logits): its examples cannot be compared one by one."""
        return bool(leaf.loose)

    def measure(
        self,
        got: dict,
        want: dict,
        leaves: list[OutLeaf],
        *,
        examples=None,
        want_examples=None,
        positions: dict | None = None,
        want_positions: dict | None = None,
        pad_examples=None,
        pads: dict | None = None,
    ) -> float:
        """The largest deviation over `leaves` between `got` and `want`, each restricted to
        some examples (on every batch axis) and some positions of token groups, real
        tokens only (`pads`, bool [batch, length] per group, default the inputs')."""
        worst = 0.0
        pads = self.layout.pads if pads is None else pads
        for leaf in leaves:
            if leaf.path not in got or leaf.path not in want:
                return float("inf")
            a = _restrict(got[leaf.path], leaf, examples, positions)
            b = _restrict(
                want[leaf.path], leaf, want_examples or examples, want_positions or positions
            )
            if a is None or b is None or a.shape != b.shape:
                self.mismatch = (
                    f"{_path(leaf.path)} is {list(got[leaf.path].shape)} where "
                    f"{list(b.shape) if b is not None else '?'} was expected"
                )
                return float("inf")
            rows = pad_examples if pad_examples is not None else want_examples or examples
            keep = _real(a, leaf, pads, rows, want_positions or positions)
            worst = max(worst, deviation(a, b, scale_of(b, keep), keep))
        return worst

    def result(
        self,
        name: str,
        dev: float,
        action: str,
        target: str,
        hint: str,
        point=None,
        lead: str = "first seen at ",
        where: str = "",
    ) -> ProbeResult:
        """Passed or failed by `dev` against the tolerance: "<action> left <target>
        unchanged", or "<action> moved <target> by ..." with the op `point()` names."""
        tol = self.rtol
        if dev <= tol:
            return ProbeResult(
                name, "passed", f"{action} left {target} unchanged (deviation {dev:.1e})", dev, tol
            )
        op = point() if point is not None else ""
        at = f"\n  {lead}{op}" if op else ""
        return ProbeResult(
            name,
            "failed",
            f"{action} moved {target}{where} by {_fmt(dev, self.mismatch)} of the output's "
            f"scale (tolerance "
            f"{tol:.0e}){at}\n  hint: {hint}",
            dev,
            tol,
            op,
        )


def _restrict(t: torch.Tensor, leaf: OutLeaf, examples, positions):
    if examples is not None:
        index = torch.as_tensor(examples, dtype=torch.long)
        for d in leaf.batch:
            if d >= t.dim():
                return None
            t = take(t, d, index)
        for d, (outer, inner) in leaf.folded.items():
            batch = t.shape[d] // max(outer * inner, 1) if d < t.dim() else 0
            if d >= t.dim() or batch * outer * inner != t.shape[d]:
                return None
            t = take(t, d, example_rows(examples, batch, outer, inner))
    if positions:
        for d, g in leaf.seq.items():
            if g in positions and positions[g] is not None:
                if d >= t.dim():
                    return None
                t = take(t, d, torch.as_tensor(positions[g], dtype=torch.long))
    return t


def _real(t: torch.Tensor, leaf: OutLeaf, pads: dict, examples, positions):
    """True where an output row belongs to a real token (its example and position read
    from the group's padding); None when nothing is padded. An output without a batch
    axis (a batch of one) takes the padding of its one example."""
    if len(leaf.batch) > 1:
        return None
    keep = None
    for d, g in leaf.seq.items():
        pad = pads.get(g)
        if pad is None or not bool(pad.any()):
            continue
        if examples is not None and leaf.batch:
            pad = pad[torch.as_tensor(examples, dtype=torch.long)]
        if positions and positions.get(g) is not None:
            pad = pad[:, torch.as_tensor(positions[g], dtype=torch.long)]
        shape = [1] * t.dim()
        if not leaf.batch:
            if pad.shape[0] != 1 or pad.shape[1] != t.shape[d]:
                continue
            shape[d] = -1
            real = (~pad[0]).view(shape).expand(t.shape)
        else:
            (batch,) = leaf.batch
            if tuple(pad.shape) != (t.shape[batch], t.shape[d]):
                continue
            shape[batch], shape[d] = pad.shape
            real = (~pad).view(shape) if batch < d else (~pad).t().contiguous().view(shape)
            real = real.expand(t.shape)
        keep = real if keep is None else keep & real
    return keep


def _fmt(dev: float, mismatch: str = "") -> str:
    if dev != float("inf"):
        return f"{dev:.2g}"
    return f"inf ({mismatch})" if mismatch else "inf (NaN appeared)"


def _path(path: tuple) -> str:
    return "the output" if not path else "the output " + ".".join(map(str, path))


def not_finite(layout: Layout, refs: dict) -> str:
    """Where the reference outputs hold NaN or inf on real tokens ("" where they do not):
    a comparison with them proves nothing."""
    for leaf in layout.outputs:
        t = refs.get(leaf.path)
        if t is None or not t.is_floating_point():
            continue
        keep = _real(t, leaf, layout.pads, None, None)
        values = t[keep.to(t.device)] if keep is not None else t
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            share = (
                "every value" if bool(bad.all()) else f"{int(bad.sum())} of {values.numel()} values"
            )
            return f"{_path(leaf.path)} is not finite on the unmodified input ({share} NaN or inf)"
    return ""


def out_rows(subject: Subject, out: torch.Tensor, *, examples=None, positions=None):
    """The first output restricted to some examples (batch axis) and query positions."""
    if examples is not None:
        if subject.out_batch is None:
            raise ValueError("out_rows: examples of an output without a batch axis")
        out = take(out, subject.out_batch, torch.as_tensor(examples))
    if positions is not None:
        if subject.out_seq is None:
            raise ValueError("out_rows: positions of an output without a query axis")
        out = take(out, subject.out_seq, torch.as_tensor(positions))
    return out


def declared_sizes(model) -> dict:
    """The sizes the first module that declares a head count declares (heads, d_k, ...)."""
    for module in model.modules():
        found = _axes.declared_sizes(module)
        if "heads" in found:
            return found
    return {}
