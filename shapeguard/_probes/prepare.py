"""What the probes run on: the float64 copy of the module, its inputs and reference
outputs, the subject as given for a second opinion, and a grown batch where the input
has one example (`check`)."""

import copy
import weakref

from .. import _probes
from . import ProbeResult
from .report import CheckReport
from .result import inconclusive
from .runs import pin
from .traced import Traced, trace_for_probes


def prepare_subject(work, model, args, kwargs, traced: Traced, causal, seed, report):
    """The float64 copy, its inputs and reference outputs, for the probes; or a result
    saying why the probes cannot run."""
    import inspect

    import torch

    from . import intent
    from .graph_layout import read_graph
    from .layout import read_layout

    try:
        params = [p for p in inspect.signature(type(work).forward).parameters if p != "self"]
    except (TypeError, ValueError):
        params = []
    names = [params[i] if i < len(params) else f"arg{i}" for i in range(len(args))]
    found = _probes.leaves((args, kwargs))
    if not found:
        return _probes.not_applicable("probes", "the module takes no tensor input")
    leaf_names = {path: _leaf_name(path, names) for path, _ in found}
    layout = read_layout(found, leaf_names, traced.in_metas, traced.watch, traced.out_metas)
    if isinstance(layout, str):
        return inconclusive("probes", layout)
    for pending in layout.pending:
        _settle_pending(work, args, kwargs, layout, pending, leaf_names, traced)
    avoid_pad_ids(work, layout)
    generator = torch.Generator().manual_seed(seed)
    rng = _pin_of(work, seed)  # before the copy is made: the copy shares it
    candidate, inputs, output, refs, void = _reference(work, args, kwargs, layout)
    reference = _probes.first_output(output)
    if reference is None:
        return _probes.not_applicable("probes", "the module returned no floating-point tensor")
    report.dtype = str(reference.dtype).removeprefix("torch.")
    random_ = ""
    if not void:
        from .steady import steadiness

        rtol = _probes.rtol_for(reference.dtype)
        void, random_ = steadiness(candidate, inputs, refs, list(refs), rng, rtol)
    out_batch, out_seq = _first_axes(layout, output, reference)
    elsewhere = ""
    if causal is True:
        why = "declared with causal=True"
    elif causal is False:
        why = ""
    else:
        why = traced.watch.causal or intent.declared_causal(work)
        elsewhere = intent.causal_elsewhere(layout, traced.watch) if why else ""
        why = "" if elsewhere else why
    subject = _probes.Subject(
        model=candidate,
        inputs=inputs,
        layout=layout,
        reference=reference,
        out_batch=out_batch,
        out_seq=out_seq,
        watch=traced.watch,
        events=traced.trace.events,
        declared=_probes.declared_sizes(work),
        rtol=_probes.rtol_for(reference.dtype),
        generator=generator,
        causal=why,
        traced_model=work,
        refs=refs,
        findings=traced.trace.findings,
        distributed=intent.sharded(work, (args, kwargs)),
        void=void,
        random=random_,
        not_causal=elsewhere,
    )
    try:
        subject.graph = read_graph(found, leaf_names, traced, why)
    except Exception as error:  # the graph probe reports it as its own crash
        subject.graph = error
    subject.rtol = _tolerance(subject)
    if candidate is not work:
        # The memo is a field of the subject it reads: held weakly, else the two make a
        # cycle, and the float64 copy, the inputs and the trace's watch (its session) would
        # wait for a full collection once the check is done.
        held = weakref.ref(subject)
        subject.as_given = _memo(lambda: _given(held(), work, args, kwargs, seed))
    if layout.batch_size == 1:
        subject.grown = _memo(
            lambda: _grown(work, model, args, kwargs, layout, causal, seed, traced)
        )
    return subject


def _reference(work, args, kwargs, layout):
    """(module, inputs, output, reference leaves, why they prove nothing) of the run every
    probe compares with: the float64 copy's, or the module as given where float64 is
    refused (a float32 constant, an op without double) or gives outputs that are not
    finite where the given dtype's are."""
    import torch

    from .subject import not_finite

    try:
        candidate = _copy_as(work, torch.float64)
        inputs = _inputs_as((args, kwargs), torch.float64)
        output = candidate(*inputs[0], **inputs[1])
    except Exception:
        candidate = None  # float64 refused: as given
    if candidate is not None:
        refs = _refs(layout, output)
        bad = not_finite(layout, refs)
        if not bad:
            return candidate, inputs, output, refs, ""
    output = work(*args, **kwargs)
    refs = _refs(layout, output)
    bad = not_finite(layout, refs)
    why = (
        f"{bad}: a comparison proves nothing (weights left uninitialised, an overflow)"
        if bad
        else ""
    )
    return work, (args, kwargs), output, refs, why


def _refs(layout, output) -> dict:
    import torch

    refs = {}
    for leaf in layout.outputs:
        value = _probes.pick(output, leaf.path)
        if isinstance(value, torch.Tensor):
            refs[leaf.path] = value
    return refs


def _pin_of(model, seed: int):
    """The RNG pin on `model` (`run_probes` puts it there before the probes); a caller
    that builds a subject on its own copy (bench/check_probe.py) gets one put there now,
    so the reference run and every probe run start from one RNG state all the same."""
    from .runs import Pin

    found = next((h for h in model._forward_pre_hooks.values() if isinstance(h, Pin)), None)
    return found if found is not None else pin(model, seed)


def avoid_pad_ids(model, layout) -> None:
    """Token ids a probe must not draw: the model's pad id (its config's, every embedding's
    padding_idx), which a module may read as padding, not as a token."""
    import torch

    avoid = set()
    config = getattr(model, "config", None)
    for holder in (config, getattr(config, "text_config", None)):
        pad = getattr(holder, "pad_token_id", None)
        for value in pad if isinstance(pad, list | tuple) else (pad,):
            if isinstance(value, int) and not isinstance(value, bool):
                avoid.add(value)
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
            avoid.add(int(module.padding_idx) % module.num_embeddings)
    for leaf in layout.leaves.values():
        if leaf.kind == "ids":
            leaf.avoid = frozenset(avoid)


def _memo(make):
    made: list = []

    def once():
        if not made:
            made.append(make())
        return made[0]

    return once


def _given(subject, work, args, kwargs, seed):
    """The subject in the dtype the module was given (its traced copy, the inputs as
    they came); None when it is gone (its memo holds it weakly)."""
    import dataclasses

    import torch

    if subject is None:
        return None

    output = work(*args, **kwargs)
    reference = _probes.first_output(output)
    if reference is None:
        return None
    refs = _refs(subject.layout, output)
    from .subject import not_finite

    bad = not_finite(subject.layout, refs)
    # From the grown memo, not the subject (whose as_given memo holds this one): a cycle.
    grown = subject.grown
    given = dataclasses.replace(
        subject,
        model=work,
        inputs=(args, kwargs),
        reference=reference,
        refs=refs,
        rtol=_probes.rtol_for(reference.dtype),
        generator=torch.Generator().manual_seed(seed),
        as_given=None,
        grown=_memo(lambda: _grown_as_given(grown)) if grown else None,
        void=subject.void or (f"{bad}: a comparison proves nothing" if bad else ""),
    )
    given.rtol = _tolerance(given)
    return given


def _grown(work, model, args, kwargs, layout, causal, seed, traced):
    """For a batch of one: the subject of the batch grown to two (example 0, then a second
    example made like it), traced again so its batch axis is read from provenance; or why
    there is none."""
    import torch

    from .edits import grown

    args2, kwargs2 = grown(layout, (args, kwargs), torch.Generator().manual_seed(seed + 1))
    again = trace_for_probes(work, args2, kwargs2, like=traced)
    if again.error is not None:
        first = str(again.error).strip().splitlines()
        return f"the module fails on it ({first[0] if first else type(again.error).__name__})"
    try:
        subject = prepare_subject(work, model, args2, kwargs2, again, causal, seed, CheckReport(""))
    except Exception as error:
        return f"the module fails on it outside the trace ({error})"
    if isinstance(subject, ProbeResult):
        return subject.message.splitlines()[0]
    if subject.layout.batch_size != 2:
        return "the grown batch's batch axis cannot be read from the trace"
    return subject


def _grown_as_given(grown_memo):
    """The grown batch's subject (`Subject.grown`, called) in the dtype the module was
    given."""
    grown = grown_memo()
    if grown is None or isinstance(grown, str) or grown.as_given is None:
        return grown
    return grown.as_given()


def _settle_pending(work, args, kwargs, layout, pending, leaf_names, traced) -> None:
    """A uniform mask no op applied, as long as two sequences (an all-ones attention_mask
    of an encoder-decoder with equal lengths): pad one key and trace again, to see which
    sequence the module applies it to."""
    from .layout import read_layout
    from .layout_masks import padded_once, settle_pending

    inputs = padded_once(layout, (args, kwargs), pending)
    retraced = trace_for_probes(work, *inputs, like=traced)
    if retraced.error is not None:
        return
    found = _probes.leaves(inputs)
    again = read_layout(found, leaf_names, retraced.in_metas, retraced.watch, retraced.out_metas)
    if not isinstance(again, str):
        settle_pending(layout, pending, again)


def _tolerance(s) -> float:
    """The tolerance of the least precise dtype the module computes in: one example run
    under a scan of every op's output dtype (a float64 copy may cast to float32 inside)."""
    import torch

    from .._trace.opening import run_observed

    scan = _probes.DtypeScan()
    inputs = s.inputs
    if s.layout.batch_size:
        inputs = _probes.take_examples(s.layout, inputs, torch.tensor([0]))
    try:
        run_observed(s.model, inputs[0], inputs[1], lambda session: scan)
    except Exception:
        return s.rtol
    return max(s.rtol, _probes.tolerance(scan.dtypes))


def _first_axes(layout, output, reference) -> tuple[int | None, int | None]:
    """The batch and query axes of the first floating output, from the layout."""
    for leaf in layout.outputs:
        if _probes.pick(output, leaf.path) is reference:
            batch = leaf.batch[0] if len(leaf.batch) == 1 else None
            seq = next((d for d, g in leaf.seq.items() if g == 0), None)
            return batch, seq
    return None, None


def _leaf_name(path: tuple, positional: list[str]) -> str:
    where, *rest = path
    head = positional[rest[0]] if where == 0 and rest[0] < len(positional) else str(rest[0])
    return ".".join([head, *map(str, rest[1:])])


def _copy_as(module, dtype):
    return copy.deepcopy(module).to(dtype)


def _inputs_as(inputs, dtype):
    return _probes.rebuild(inputs, lambda _, t: t.to(dtype) if t.is_floating_point() else t)
