"""The small sample `shapeguard run --keep-inputs` writes: the first `KEPT_EXAMPLES` examples
of a module's first traced call.

Which axis of each input is the batch is read as the probes read it (`_probes.layout`,
from the axis provenance of one traced forward on a private copy of the module), never
from sizes or names. The call is kept whole where that reading has no answer (no batch
axis seen, the layout unreadable), where the batch is no larger than the bound, or where
the module fails on the cut inputs (then the cut was not a call the module takes).
"""

from .run_check import Sample

KEPT_EXAMPLES = 4


def first_examples(module, sample: Sample) -> tuple[Sample, int | None, int | None]:
    """(the sample, its batch size, the examples kept): `sample` cut to its first
    `KEPT_EXAMPLES` examples, or itself with None kept where it is kept whole."""
    import torch

    from .. import _probes
    from .._probes.edits import sliced
    from .._probes.layout import read_layout
    from .._probes.traced import trace_for_probes
    from .._probes.tree import rebuild
    from .._probes.untouched import untouched

    inputs = (sample.args, sample.kwargs)
    try:
        with untouched(module) as work, torch.no_grad():
            traced = trace_for_probes(work, sample.args, sample.kwargs)
            if traced.error is not None:
                return sample, None, None
            found = _probes.leaves(inputs)
            names = {path: str(path) for path, _ in found}
            layout = read_layout(found, names, traced.in_metas, traced.watch, traced.out_metas)
            if isinstance(layout, str) or layout.batch_size is None:
                return sample, None, None
            batch = layout.batch_size
            if batch <= KEPT_EXAMPLES:
                return sample, batch, None
            # A cut tensor is a view: cloned, or torch.save would write the whole batch.
            args, kwargs = rebuild(
                sliced(layout, inputs, batch=KEPT_EXAMPLES), lambda _, t: t.clone()
            )
            work(*args, **kwargs)
    except Exception:  # the cut is not a call the module takes: the whole call is kept
        return sample, None, None
    return Sample(tuple(args), dict(kwargs)), batch, KEPT_EXAMPLES
