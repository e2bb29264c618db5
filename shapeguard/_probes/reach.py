"""The reach probe: which input tokens move which outputs, measured, checked against the
intent the other probes establish, kept for the table, the JSON and the drawing.

The reach is measured on the whole model (`reach_measure`: autograd through the
embedding, else perturbation; bounded). It is checked against three invariants, each
only where its intent is established, the same intent the other probes read:

- examples never move each other (the batch axis is known: `batch independence`'s
  preconditions);
- a padded input never moves a real output (a padding mask among the inputs, its
  polarity as the module applies it: `key-padding invariance`'s);
- in a causal module (`Subject.causal`: declared, the trace's causal mask or
  is_causal, an attention layer's is_causal), an output never moves with a later
  input of its own example.

A cell the gradient flags is no finding yet: it is one only with a counterexample the
unmodified module gives, the one input redrawn and that output moved beyond tolerance
(`_confirmed`); a padded input that reaches the real outputs outside attention (a
convolution along the positions) is no finding either (`padding_paths`). Where no
intent is established (one example, no padding, not causal: a bidirectional encoder)
the reach is recorded and shown, and the probe is not applicable, saying what it saw.

The other probes judge one edit each (the last example, one split, one padded example);
this one measures every measured cell and points at the first that breaks an invariant,
so a failure here names the output and the input that moves it.
"""

from dataclasses import dataclass, replace

import torch

from .._reach.rows import Reach, runs_where
from .compare import scale_of
from .edits import perturbed
from .locate import locate, region_batch, region_padding, region_prefix
from .reach_measure import Measured, measure, output_row, token_inputs
from .reach_record import MeasuredReach
from .result import ProbeResult, inconclusive, not_applicable
from .subject import Subject

NAME = "reach"
TRIES = 3  # flagged cells confirmed at most, per invariant, strongest first


@dataclass(frozen=True, slots=True)
class Cell:
    """Output row j of the i-th measured example, moved by input (example, position)."""

    i: int
    j: int
    example: int
    position: int


def measured_reach(s: Subject) -> ProbeResult:
    """Measure the model's reach and check it against the established intent."""
    layout = s.layout
    if not layout.lengths:
        return not_applicable(NAME, "no input has a token axis")
    if layout.batch_size is None:
        # Which axis is which example cannot be read (a view that mixed the batch in,
        # the trace's finding): no reach to lay out per example.
        return not_applicable(NAME, "no input has a batch axis")
    if layout.ambiguous:
        return inconclusive(NAME, layout.ambiguous)
    if s.out_batch is None and layout.batch_size != 1:
        return not_applicable(NAME, _no_batch_axis(s))
    measured = measure(s)
    if isinstance(measured, str):
        return inconclusive(NAME, f"the reach cannot be measured: {measured}")
    moved = measured.moved()
    record = _record(s, measured, moved)
    intents = _intents(s, measured)
    found = []
    for kind, candidates in _candidates(s, measured, moved, intents).items():
        hit = _first_confirmed(s, measured, candidates)
        if hit is not None:
            found.append((kind, *hit))
    found, outside = _through_attention(s, found)
    if found:
        marks = tuple(_mark(measured, cell) for _, cell, _, _ in found)
        record = replace(record, reach=replace(record.reach, marks=marks), broken=found[0][0])
        result = _failure(s, measured, record, found)
    elif outside:
        result = inconclusive(NAME, outside)
    elif intents:
        result = _passed(s, measured, record, intents)
    else:
        result = not_applicable(NAME, _measured_only(s, measured, record))
    result.reach = record
    return result


def _no_batch_axis(s: Subject) -> str:
    """Why the first output has no batch axis to lay the reach out on, naming what the
    trace saw there: the batch folded with other factors into one axis (a window
    partition's [batch * windows]), or nothing."""
    head = "the first output has no batch axis whose examples can be told apart"
    first = next((o for o in s.layout.outputs if s.refs.get(o.path) is s.reference), None)
    if first is None or not first.folded:
        return head
    d, (outer, inner) = next(iter(first.folded.items()))
    size = int(s.reference.shape[d])
    return (
        f"the first output has no batch axis of its own: its axis {d} ({size}) folds the "
        f"batch with other factors ({outer} outside it, {inner} inside: [batch * windows] "
        "after a window partition, for one), so the reach cannot be laid out per example; "
        "the batch probes read the examples' rows from it"
    )


# -- the record ---------------------------------------------------------------------------
def _record(s: Subject, m: Measured, moved: torch.Tensor) -> MeasuredReach:
    """The reach within each measured example, and the counts across examples."""
    own = torch.stack([moved[i, :, b] for i, b in enumerate(m.examples)])  # [E, rows, L]
    reach = Reach.from_visible(own, lead=(len(m.examples),), how="probe", lead_axes=("batch",))
    if m.positions is not None:
        queries = None if len(m.positions) == m.out_length else m.positions
        reach = replace(reach, seq_q=m.out_length, queries=queries)
    pad = s.layout.padded(0)
    if pad is not None:
        reach = replace(reach, padding=tuple(runs_where(pad[b].tolist()) for b in m.examples))
    crossing = []
    for i, b in enumerate(m.examples):
        for other in range(moved.shape[2]):
            n = int(moved[i, :, other].sum())
            if other != b and n:
                crossing.append((b, other, n))
    batch = s.layout.batch_size or 1
    return MeasuredReach(reach, batch, tuple(crossing), m.how, m.positions is not None)


def _mark(m: Measured, cell: Cell):
    """The cell as `Reach.marks` holds it: (leading index, query, runs of keys)."""
    q = m.positions[cell.j] if m.positions is not None else 0
    return ((cell.i,), q, ((cell.position, cell.position + 1),))


# -- intent and the cells that break it ------------------------------------------------------
def _intents(s: Subject, m: Measured) -> dict[str, str]:
    """The invariants whose intent is established, each with its reason."""
    layout = s.layout
    found = {}
    if (
        (layout.batch_size or 1) >= 2
        and not layout.ambiguous_batch
        and s.out_batch is not None
        and any(s.refs.get(leaf.path) is s.reference for leaf in s.outputs(batch=True))
    ):
        # The measured output's examples can be told apart (not CLIP's texts-by-images
        # logits, whose rows are meant to see every example of the other kind).
        found["batch"] = "examples never move each other"
    pad = layout.padded(0)
    if pad is not None and bool(pad.any()):
        masks = [leaf.name for leaf in layout.leaves.values() if leaf.padding]
        found["padding"] = f"a padded input never moves a real output ({', '.join(masks)})"
    if s.causal and m.positions is not None and m.out_length == layout.lengths[0]:
        found["causal"] = f"no output moves with a later input (causal: {s.causal})"
    return found


def _candidates(s: Subject, m: Measured, moved, intents) -> dict[str, list[Cell]]:
    """The flagged cells of each established invariant, strongest first."""
    length = s.layout.lengths[0]
    pad = s.layout.padded(0)
    if pad is None:
        pad = torch.zeros(moved.shape[2], length, dtype=torch.bool)
    found: dict[str, list[Cell]] = {kind: [] for kind in intents}
    for i, j, b_in, p in moved.nonzero().tolist():
        b = m.examples[i]
        q = m.positions[j] if m.positions is not None else None
        if q is not None and m.out_length == length and bool(pad[b, q]):
            continue  # a padded output row: no property holds there
        cell = Cell(i, j, b_in, p)
        if b_in != b:
            kind = "batch"
        elif bool(pad[b, p]):
            kind = "padding"
        elif q is not None and p > q:
            kind = "causal"
        else:
            continue
        if kind in found:
            found[kind].append(cell)
    strength = m.strength

    def strongest(c: Cell) -> tuple:
        return (-float(strength[c.i, c.j, c.example, c.position]),)

    def first(c: Cell) -> tuple:  # the first output that sees a later input, as users read
        return (c.i, c.j, c.position)

    return {
        kind: sorted(cells, key=first if kind == "causal" else strongest)
        for kind, cells in found.items()
        if cells
    }


def _first_confirmed(s: Subject, m: Measured, cells: list[Cell]):
    """(cell, changed inputs, deviation) of the first of `cells` a run confirms, or None."""
    for cell in cells[:TRIES]:
        changed, dev = _confirmed(s, m, cell)
        if dev > s.rtol:
            return cell, changed, dev
    return None


def _confirmed(s: Subject, m: Measured, cell: Cell):
    """The inputs with input (example, position) redrawn, and how far that moved the
    output row, relative to the output's scale."""
    cells = torch.zeros(s.layout.batch_size or 1, s.layout.lengths[0], dtype=torch.bool)
    cells[cell.example, cell.position] = True
    changed = perturbed(s.layout, s.inputs, s.generator, group=0, cells=cells)
    got = s.run(changed, f"input {cell.position} of example {cell.example} changed")
    b = m.examples[cell.i]
    q = m.positions[cell.j] if m.positions is not None else None
    a, want = output_row(s, got, b, q), output_row(s, s.reference, b, q)
    if a.shape != want.shape:
        return changed, float("inf")
    gap = (a.double() - want.double()).abs()
    gap = gap[torch.isfinite(gap)]
    return changed, (float(gap.max()) / scale_of(s.reference) if gap.numel() else 0.0)


# -- the verdicts ----------------------------------------------------------------------------
HINTS = {
    "batch": (
        "something mixes examples: a reduction or view across the batch axis, attention over "
        "the batch axis, or a [batch, seq] mask read as [seq_q, seq_k]"
    ),
    "padding": (
        "padded inputs reach real outputs: hide padded keys in every attention over them, on "
        "the key axis, before the softmax"
    ),
    "causal": (
        "an output sees a later input: hide key j from query i when j > i (never j > i + 1), "
        "in every layer and head"
    ),
}


def _failure(s: Subject, m: Measured, record: MeasuredReach, found) -> ProbeResult:
    kind, cell, changed, dev = found[0]
    b = m.examples[cell.i]
    q = m.positions[cell.j] if m.positions is not None else None
    tokens = token_inputs(s)
    at = f"position {cell.position} of example {cell.example}"
    output = (
        f"the output at position {q} of example {b}" if q is not None else f"example {b}'s output"
    )
    length = s.layout.lengths[0]
    if kind == "batch":
        action = f"changing {tokens} at {at}"
        target = f"{output}, another example"
        region = region_batch(s.layout.batch_size or 1, [b])
    elif kind == "padding":
        action = f"changing {tokens} at the padded {at}"
        target = f"{output}, a real token"
        region = region_padding(length, _padded_positions(s, b))
    else:
        action = f"changing {tokens} at {at}, later than {q} (the module is causal: {s.causal})"
        target = output
        region = region_prefix("seq", length, (q or 0) + 1, same_size=True)

    def point():
        return locate(s, s.inputs, changed, region)

    result = s.result(NAME, dev, action, target, HINTS[kind], point)
    first, *rest = result.message.split("\n")
    lines = [first, f"  measured by {m.how}: {_row_line(record, cell.i, b, q)}"]
    lines += [f"  also: {_also(k, c, m)}" for k, c, _, _ in found[1:]]
    result.message = "\n".join([*lines, *rest])
    return result


def _padded_positions(s: Subject, b: int) -> list[int]:
    pad = s.layout.padded(0)
    return pad[b].nonzero().flatten().tolist() if pad is not None else []


def _through_attention(s: Subject, found: list) -> tuple[list, str]:
    """`found` without a padded input that reaches the outputs outside attention (its
    mask does not promise to hide it there), and the reason where one was dropped."""
    kept, why = [], ""
    for kind, cell, changed, dev in found:
        outside = _outside_attention(s, changed, cell.position, dev) if kind == "padding" else ""
        if outside:
            why = outside
        else:
            kept.append((kind, cell, changed, dev))
    return kept, why


def _outside_attention(s: Subject, changed, position: int, dev: float) -> str:
    """The inconclusive reason where the padded input reaches the outputs outside
    attention (`padding_paths`), or ""."""
    from .padding_paths import not_promised, padding_paths

    compared = s.outputs(batch=True) or s.outputs()
    try:
        paths = padding_paths(s, s.inputs, changed, compared, s.layout.lengths[0], [position])
    except Exception:
        return ""  # no evidence either way: the counterexample stands
    if paths is None or paths.elsewhere is None:
        return ""
    return not_promised(paths.elsewhere, dev)


def _also(kind: str, cell: Cell, m: Measured) -> str:
    b = m.examples[cell.i]
    q = m.positions[cell.j] if m.positions is not None else None
    out = f"output {q} of example {b}" if q is not None else f"example {b}'s output"
    what = {"batch": "another example's", "padding": "a padded", "causal": "a later"}[kind]
    return f"{out} moves with {what} input ({cell.position} of example {cell.example})"


def _row_line(record: MeasuredReach, i: int, b: int, q: int | None) -> str:
    crossing = sum(n for out, _, n in record.crossing if out == b)
    line = record.line(i, q).replace(f"example {i}", f"example {b}")
    return line + (f"; {crossing} cells of other examples move it too" if crossing else "")


def _passed(s: Subject, m: Measured, record: MeasuredReach, intents) -> ProbeResult:
    said = "; ".join(intents.values())
    if s.causal and "causal" not in intents:
        said += "; the output keeps no positions, so no claim on later inputs"
    rows = len(m.positions) if m.positions is not None else 1
    shape = f"{len(m.examples)} examples x {rows} outputs x {s.layout.lengths[0]} inputs"
    return ProbeResult(
        NAME,
        "passed",
        f"measured by {m.how} ({shape}): {said}; {record.line()}",
        0.0,
        s.rtol,
    )


def _measured_only(s: Subject, m: Measured, record: MeasuredReach) -> str:
    """Why no invariant applies, naming what was seen, then the reach measured."""
    seen = []
    if s.layout.batch_size == 1:
        seen.append("one example")
    else:  # the batch intent was not established: `_intents`
        seen.append("an output whose examples cannot be told apart")
    pad = s.layout.padded(0)
    seen.append("no padding mask" if pad is None else "no padded input")
    if not s.causal:
        seen.append(f"not causal ({s.not_causal or 'no causal mask, is_causal or declaration'})")
    elif m.positions is None:
        seen.append("an output without positions")
    full = all(
        record.reach.row((i,), q) == ((0, record.reach.seq_k),)
        for i in range(len(m.examples))
        for q in record.reach.kept_queries
    )
    if full and m.positions is not None:
        seen.append("every output moves with every input (bidirectional)")
    return f"measured only, no intent to compare with: {', '.join(seen)}; {record.line()}"
