"""`reach_other_example`: a query that sees a key of another example.

Judged only where the keys' axis at the site carries the batch whole, as one factor whose
kind is established by structure or declaration (a contract or jaxtyping annotation that
names `batch`, an earlier attention op's leading axis), never by convention: the first
axis of the model's input alone is no evidence. The query's example is then the same
factor on the queries' axis (examples packed back to back by a reshape: `(batch seq)`),
or the reach's leading axis that carries it (scores over examples made by an einsum or a
view that read `[batch, seq]` as `[seq, batch]`). Where neither holds, nothing is claimed.
"""

import dataclasses
from math import prod

from .._errors import Violation
from .._names import dims as D
from . import intent as _intent
from .invariants import operands, shape_text
from .rows import Reach, runs_text

_MARKED = 64  # cells kept in `Reach.marks`, at most
_HOW = {D.CONTRACT: "named batch by a contract", D.STRUCTURE: "batch by structure"}


def judge(call, reach: Reach) -> tuple[Reach, Violation] | None:
    """The reach with its crossing cells marked and the finding, or None (no crossing, or
    no established batch on the keys)."""
    axes = _intent.site_axes(call, reach)
    if axes is None:
        return None
    q_axis, k_axis, lead_dims = axes
    found = _batch_factor(k_axis, reach.seq_k)
    if found is None:
        return None
    atom, key_examples = found
    query_examples = _examples_along(q_axis, atom, reach.seq_q)
    lead_axis = None
    if query_examples is None:
        lead_axis = _lead_axis(lead_dims, atom, reach)
        if lead_axis is None:
            return None
    rows, total, first = 0, 0, None
    marks: list = []
    for index in _indices(reach, lead_axis):
        for q in reach.kept_queries:
            if lead_axis is not None:
                example = _digit(lead_dims[lead_axis[0]], lead_axis[1], index[lead_axis[0]])
            else:
                example = query_examples[q] if query_examples is not None else -1
            total += 1
            runs = reach.row(index, q)
            other = [k for a, b in runs for k in range(a, b) if key_examples[k] != example]
            if not other:
                continue
            rows += 1
            crossing = _intent.runs_of_keys(other)
            if first is None:
                first = (index, q, crossing, example, key_examples[other[0]])
            if len(marks) < _MARKED:
                marks.append((index, q, crossing))
    if first is None:
        return None
    index, q, crossing, example, theirs = first
    root = atom[0].find()
    relation = (
        f"{reach.op or call.op} over {shape_text(reach)}: {rows} of {total} query rows see keys of "
        f"another example (first at {_at(reach, index, q, lead_axis)}, of example {example}: it sees "
        f"{runs_text(crossing)} of example {theirs}); the keys' axis carries the batch, "
        f"{_HOW.get(root.kind_rank, 'batch by a parameter')}"
    )
    hint = (
        "attention runs within one example: keep the batch on its own axis; examples packed "
        "into one sequence need a block-diagonal mask from their lengths (or cu_seqlens); a "
        "[batch, seq] tensor read as [seq, batch] needs a transpose, not a view"
    )
    violation = Violation("reach_other_example", relation, operands(call), hint, severity="warning")
    return dataclasses.replace(reach, marks=tuple(marks)), violation


def _batch_factor(axis, length: int):
    """(the batch atom, each position's example) where `axis` holds the batch whole as one
    factor established as batch, else None."""
    if D.size_of(axis) != length:
        return None
    found = [atom for atom in axis if D.is_whole(atom) and D.established_kind(atom) == D.BATCH]
    if len(found) != 1:
        return None
    examples = _examples_along(axis, found[0], length)
    return (found[0], examples) if examples is not None else None


def _position(axis, atom) -> int | None:
    root = atom[0].find()
    for i, other in enumerate(axis):
        if other[0].find() is root and other[1:] == atom[1:]:
            return i
    return None


def _examples_along(axis, atom, length: int) -> list[int] | None:
    """The example of each position along `axis`, where it carries `atom`."""
    at = _position(axis, atom)
    if at is None or D.size_of(axis) != length:
        return None
    return [_digit(axis, at, x) for x in range(length)]


def _digit(axis, at: int, x: int) -> int:
    """The digit of factor `at` of position `x` along `axis` (factors outermost first)."""
    inner = prod(a[2] for a in axis[at + 1 :])
    return (x // inner) % axis[at][2]


def _lead_axis(lead_dims, atom, reach: Reach) -> tuple[int, int] | None:
    """(the reach's leading axis, the factor in it) that carries `atom`, or None."""
    for a, axis in enumerate(lead_dims):
        at = _position(axis, atom)
        if at is not None and D.size_of(axis) == reach.lead[a]:
            return a, at
    return None


def _indices(reach: Reach, lead_axis):
    """Every stored slice, and each example of the leading batch axis stored once."""
    for index in reach.slices():
        if lead_axis is None or reach.stored[lead_axis[0]] != 1:
            yield index
            continue
        a = lead_axis[0]
        for b in range(reach.lead[a]):
            yield (*index[:a], b, *index[a + 1 :])


def _at(reach: Reach, index: tuple[int, ...], query: int, lead_axis) -> str:
    """`slice (1, 0), query 2` where the slices differ (or carry the examples), else `query 2`."""
    differ = lead_axis is not None or any(size > 1 for size in reach.stored)
    shown = [f"slice {tuple(index)}"] if differ else []
    return ", ".join([*shown, f"query {query}"])
