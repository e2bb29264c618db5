"""Probes along the batch axis: examples must not see each other, nor their batch size."""

from .compare import deviation, scale_of
from .edits import distinct_length, perturbed, sizes_in_play, sliced
from .locate import crashed, locate, region_batch, region_prefix
from .result import ProbeResult, skipped
from .subject import Subject, out_rows


def batch_independence(s: Subject) -> ProbeResult:
    """Changing one example leaves the other examples' outputs unchanged."""
    name = "batch independence"
    cannot = _cannot_run(s, name)
    if cannot is not None:
        return cannot
    b = s.layout.batch_size
    j = b - 1
    changed = perturbed(s.layout, s.inputs, s.generator, example=j)
    others = list(range(j))
    out = s.run(changed)
    dev = deviation(
        out_rows(s, out, examples=others),
        out_rows(s, s.reference, examples=others),
        scale_of(s.reference),
    )

    def point():
        return locate(s, s.inputs, changed, region_batch(b, others))

    return s.result(
        name,
        dev,
        f"changing example {j} of {b}",
        "the other examples' outputs",
        "something mixes examples: a view or reshape that moves data across the batch axis, "
        "attention over the batch axis, or a [batch, seq] mask read as [seq_q, seq_k]",
        point,
    )


def sub_batch(s: Subject) -> ProbeResult:
    """The first examples, run alone, give the outputs they gave in the full batch."""
    name = "sub-batch consistency"
    cannot = _cannot_run(s, name)
    if cannot is not None:
        return cannot
    b = s.layout.batch_size
    k = distinct_length(b, sizes_in_play(s.layout, s.declared)) or 1
    small = sliced(s.layout, s.inputs, batch=k)
    try:
        out = s.run(small)
    except Exception as error:  # the module itself fails: that is the finding
        return crashed(name, f"the first {k} of {b} examples run alone", error, s, small)
    ref = s.reference.narrow(s.out_batch, 0, k)
    dev = deviation(out, ref, scale_of(s.reference))

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


def _cannot_run(s: Subject, name: str) -> ProbeResult | None:
    """Why a batch probe cannot run on this subject (a skipped result), or None."""
    b = s.layout.batch_size
    if not b or b < 2 or s.out_batch is None:
        return skipped(name, "needs a batch of 2 or more and a batch axis in the output")
    if s.layout.ambiguous:
        return skipped(name, s.layout.ambiguous)
    return None
