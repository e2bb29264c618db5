"""Probes along the batch axis: examples must not see each other, nor their batch size.

Every per-example input is changed or cut together: token ids, data, and padding
masks (an example's padding is part of the example), nested in dicts and dataclasses
alike. Outputs are compared on real tokens only. A batch of one is grown to two first:
example 0 beside a second example with its structure (other ids, the same masks).
"""

from typing import cast

import torch

from .edits import distinct_length, padded, perturbed, sizes_in_play, sliced
from .locate import locate, region_batch, region_prefix
from .result import ProbeResult, inconclusive, not_applicable
from .subject import Subject


def batch_independence(s: Subject) -> ProbeResult:
    """Changing one example leaves the other examples' outputs unchanged."""
    name = "batch independence"
    if s.layout.batch_size == 1:
        return _of_one(s, name, batch_independence)
    cannot = _cannot_run(s, name)
    if cannot is not None:
        return cannot
    b = cast(int, s.layout.batch_size)  # not None: _cannot_run passed
    j = b - 1
    changed = perturbed(s.layout, s.inputs, s.generator, example=j)
    changed, masks = _one_more_pad(s, changed, j)
    others = list(range(j))
    got = s.run_all(changed, f"example {j} of {b} changed")
    dev = s.measure(got, s.refs, s.outputs(batch=True), examples=others)

    def point():
        return locate(s, s.inputs, changed, region_batch(b, others))

    inputs = ", ".join(_per_example(s))
    return s.result(
        name,
        dev,
        f"changing example {j} of {b} ({inputs}{masks})",
        "the other examples' outputs",
        "something mixes examples: a view or reshape that moves data across the batch axis, "
        "attention over the batch axis, or a [batch, seq] mask read as [seq_q, seq_k]",
        point,
    )


def sub_batch(s: Subject) -> ProbeResult:
    """The first examples, run alone, give the outputs they gave in the full batch."""
    name = "sub-batch consistency"
    if s.layout.batch_size == 1:
        return _of_one(s, name, sub_batch)
    cannot = _cannot_run(s, name)
    if cannot is not None:
        return cannot
    if s.layout.unbatched:
        return inconclusive(name, s.layout.unbatched)
    b = cast(int, s.layout.batch_size)  # not None: _cannot_run passed
    k = distinct_length(b, sizes_in_play(s.layout, s.declared)) or 1
    small = sliced(s.layout, s.inputs, batch=k)
    got = s.run_all(small, f"the first {k} of {b} examples alone")
    first = list(range(k))
    dev = s.measure(got, s.refs, s.outputs(batch=True), want_examples=first, pad_examples=first)

    def point():
        return locate(s, s.inputs, small, region_prefix("batch", b, k))

    return s.result(
        name,
        dev,
        f"running the first {k} of {b} examples alone",
        "their outputs",
        "an example's output depends on the batch it is in: look for data moved across the "
        "batch axis, or a mask that lines up only at this batch size",
        point,
    )


def _per_example(s: Subject) -> list[str]:
    return [
        leaf.name
        for leaf in s.layout.leaves.values()
        if leaf.batch is not None and leaf.kind in ("ids", "data")
    ]


def _one_more_pad(s: Subject, inputs, example: int):
    """Mark one more key of `example` as padding (its last real one), in every padding
    mask: the example's padding is part of the example too."""
    layout = s.layout
    for group, pad in layout.pads.items():
        real = (~pad[example]).nonzero().flatten()
        if real.numel() < 2:
            continue
        cells = torch.zeros_like(pad)
        cells[example, int(real[-1])] = True
        masks = [leaf.name for leaf in layout.leaves.values() if leaf.padding]
        return padded(layout, inputs, group, cells), f"; its padding in {', '.join(masks)}"
    return inputs, ""


def _of_one(s: Subject, name: str, probe) -> ProbeResult:
    """A batch probe on a batch of one, run on the batch grown to two: example 0 beside a
    second example made like it (`edits.grown`), which the probe changes (batch
    independence) or leaves out (sub-batch: example 0 alone against example 0 beside
    the other)."""
    grown = s.grown() if callable(s.grown) else None
    if grown is None:
        return inconclusive(name, "a batch of one, and no second example could be made")
    if isinstance(grown, str):
        return inconclusive(name, f"a batch of one, grown to two: {grown}")
    result = probe(grown)
    if not result.conclusive:
        result.message = f"a batch of one, grown to two: {result.message}"
        return result
    made = "a second example made like example 0 (other ids and data, the same masks)"
    result.message = f"a batch of one grown to two with {made}: {result.message}"
    return result


def _cannot_run(s: Subject, name: str) -> ProbeResult | None:
    """Why a batch probe cannot run on this subject (an inconclusive or n/a result), or None."""
    b = s.layout.batch_size
    if b is None:
        return not_applicable(name, "no input has a batch axis")
    if s.layout.not_batch:
        return not_applicable(name, s.layout.not_batch)
    if b < 2:
        return inconclusive(name, "needs a batch of 2 or more")  # grown first: see _of_one
    if not s.outputs(batch=True):
        return not_applicable(name, "no output has a batch axis whose examples can be told apart")
    if s.layout.ambiguous_batch:
        return inconclusive(name, s.layout.ambiguous_batch)
    return None
