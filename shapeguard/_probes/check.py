"""`shapeguard.check`: trace a module once, then run the semantic probes on a copy.

The trace reports what the checks find (loud and silent bugs at their lines) and
keeps the axis provenance of every input and output; the probes read the inputs'
roles from it, then test properties that only running the module can show (batch
independence, causality, key padding, token and head permutations, length change,
decode consistency with the module's cache). Nothing of the caller's changes: the
module is copied (float64 where it can be), and the RNG states, train/eval modes
and requires_grad flags are restored even if a probe fails. See docs/check.md.
"""

import copy
import random
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _probes
from . import ProbeResult
from .report import SCHEMA_VERSION as SCHEMA_VERSION
from .report import CheckReport as CheckReport
from .result import FAILED, PASSED, demoted, inconclusive
from .runs import Rejected, describe_crash, first_line, pin

if TYPE_CHECKING:
    from .._tracer import Trace
    from .watch import Watch

PROBES = (
    _probes.batch_independence,
    _probes.sub_batch,
    _probes.causality,
    _probes.key_padding,
    _probes.token_permutation,
    _probes.head_permutation,
    _probes.length_change,
    _probes.decode_consistency,
)
# Each probe's name in the report (its results say it too; a probe that crashes does not).
NAMES = {
    _probes.batch_independence: "batch independence",
    _probes.sub_batch: "sub-batch consistency",
    _probes.causality: "causality",
    _probes.key_padding: "key-padding invariance",
    _probes.token_permutation: "token-permutation equivariance",
    _probes.head_permutation: "head-permutation invariance",
    _probes.length_change: "length change",
    _probes.decode_consistency: "decode consistency",
}


def check(model, *inputs, causal: bool | None = None, seed: int = 0, **kwargs) -> CheckReport:
    """Trace `model(*inputs, **kwargs)` and run the semantic probes on a copy of it.

    Args:
        model: an `nn.Module`.
        *inputs, **kwargs: one forward's inputs (tensors, or dicts and dataclasses of
            them). What each is (token ids, data, a padding mask and its polarity) and
            which axes are batch and tokens is read from the trace's axis provenance,
            never from names (docs/check.md).
        causal: declare the module causal (or not); by default it is causal when the
            trace sees is_causal=True, a triangular mask or one near the diagonal, or an
            attention layer declaring is_causal=True.
        seed: seeds the probes' random changes.

    Returns:
        A `CheckReport`; `report.passed` is False when a probe failed (it found a
        counterexample) or the trace found something; a probe that proves nothing either
        way is "inconclusive", with its reason, and fails nothing. `report.verdict` is
        "passed", "failed", "inconclusive" or "not probed". Print it for a table;
        `report.to_dict()` for JSON.

    Examples:
        >>> import torch, shapeguard
        >>> attn = torch.nn.MultiheadAttention(12, 3, batch_first=True)
        >>> x = torch.randn(2, 5, 12)
        >>> report = shapeguard.check(attn, x, x, x)
        >>> report.passed, [r.status for r in report.results][:2]
        (True, ['passed', 'passed'])
    """
    __tracebackhide__ = True
    return run_check(model, inputs, kwargs, causal=causal, seed=seed)


def run_check(
    model,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    causal: bool | None = None,
    seed: int = 0,
) -> CheckReport:
    """`check` with the inputs as a tuple and a dict (for the CLI and the pytest plugin)."""
    import torch

    from .._errors import ContractError

    if not isinstance(model, torch.nn.Module):
        raise ContractError(f"shapeguard.check takes an nn.Module, not {type(model).__name__}")
    args, kwargs = tuple(args), dict(kwargs or {})
    report = CheckReport(type(model).__name__)
    with _untouched(model) as work, torch.no_grad():
        traced = _trace(work, args, kwargs)
        report.findings = traced.trace.findings
        report.results.append(_shape_result(traced))
        if traced.error is not None:
            return report
        cannot = _cannot_probe(traced, (args, kwargs))
        if cannot is not None:
            report.results.append(cannot)
            return report
        hook = pin(work, seed)
        try:
            _probe(work, model, args, kwargs, traced, causal, seed, report)
        finally:
            if hook.handle is not None:
                hook.handle.remove()  # `work` is the caller's module when it could not be copied
    return report


def _probe(work, model, args, kwargs, traced, causal, seed, report) -> None:
    """Run every probe on the subject `_subject` makes, into `report`."""
    from .. import _config

    # Probe runs are plain forwards, guarded or not (the traced re-runs some probes ask
    # for switch checks back on for themselves: _probes.locate).
    with _config.disabled():
        try:
            subject = _subject(work, model, args, kwargs, traced, causal, seed, report)
        except Rejected as rejected:
            subject = inconclusive(
                "probes",
                f"the module fails outside the trace ({first_line(rejected.error)}), where "
                "it ran under it: no probe can compare its runs",
            )
        except Exception as error:
            subject = inconclusive("probes", _own_crash(error))
        if isinstance(subject, ProbeResult):
            report.results.append(subject)
            return
        for probe in PROBES:
            report.results.append(_run_probe(probe, subject))
        _hear_attention(subject, report)


def _cannot_probe(traced: "_Traced", inputs) -> ProbeResult | None:
    """Why no probe can run (an inconclusive result), or None."""
    from .steady import held_state

    if traced.watch.broken:
        return inconclusive(
            "probes",
            f"shapeguard's own probe code failed while watching the forward "
            f"({traced.watch.broken}): what it read of the inputs cannot be trusted, so no "
            "probe ran (this is shapeguard's fault, not the module's: please report it)",
        )
    held = held_state(inputs)
    if held:
        return inconclusive(
            "probes",
            f"the inputs hold the module's own cache or state ({', '.join(held)}): the "
            "probes cannot cut, change or copy it with the examples and tokens, and each run "
            "changes it; check the module without it",
        )
    return None


def _own_crash(error: Exception) -> str:
    return (
        f"shapeguard's probe code failed: {describe_crash(error)}; this says nothing about "
        "the module (it is shapeguard's fault: please report it)"
    )


def _hear_attention(subject, report: CheckReport) -> None:
    """Make the passed probes inconclusive when the outputs do not depend on the
    attention (`liveness`): a pass there proves nothing about it."""
    from .liveness import deaf

    if subject.void or not any(r.status == PASSED for r in report.results[1:]):
        return
    heads = next((r for r in report.results if r.name == NAMES[_probes.head_permutation]), None)
    if heads is not None and heads.status == PASSED and heads.deviation:
        # Permuting the heads moved the output by its rounding: the attention's values
        # reach it (a projection or gate at zero gives exactly 0), no run needed.
        return
    try:
        why = deaf(subject)
    except Exception:
        return  # no evidence either way: the passes stand
    if why:
        report.results[1:] = [
            demoted(r, why) if r.status == PASSED else r for r in report.results[1:]
        ]


# -- leaving the caller's module as it was ----------------------------------------------
@contextmanager
def _untouched(model):
    """A private copy of `model` in eval mode; RNG states, modes and requires_grad
    restored afterwards. Without a copy (deepcopy failed), the module itself,
    with its parameters and buffers restored too. The caller's module is in eval mode
    while the check runs as well: a copy can still call its modules through a closure
    (minGPT's `mlpf` lambda calls the original's Dropout), and the probes test eval mode."""
    import torch

    rng = torch.get_rng_state()
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()
        else None
    )
    py_rng = random.getstate()
    modes = {m: m.training for m in model.modules()}
    grads = {p: p.requires_grad for p in model.parameters()}
    saved = None
    try:
        work = copy.deepcopy(model)
    except Exception:
        work = model
        saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    try:
        model.eval()
        work.eval()
        yield work
    finally:
        torch.set_rng_state(rng)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        random.setstate(py_rng)
        if saved is not None:
            with torch.no_grad():
                for key, value in model.state_dict(keep_vars=True).items():
                    if value.shape == saved[key].shape:
                        value.copy_(saved[key])
        for module, training in modes.items():
            module.training = training
        for param, flag in grads.items():
            param.requires_grad_(flag)


# -- the trace --------------------------------------------------------------------------
@dataclass(slots=True)
class _Traced:
    trace: "Trace"
    watch: "Watch"
    out_axes: tuple = ()
    error: Exception | None = None
    # The inputs' and outputs' metas when the forward ended (their axis provenance).
    in_metas: dict = field(default_factory=dict)
    out_metas: list = field(default_factory=list)  # (path, tensor, meta) of floating outputs
    on: bool = True  # checks were on for it (so the retraces of its probes are too)


def _trace(model, args: tuple, kwargs: dict, *, like: _Traced | None = None) -> _Traced:
    """One forward under shapeguard, warnings recorded as findings instead of raised.
    A retrace `like` an earlier trace (a pending mask, a batch of one grown to two, run
    from inside the probes' `disabled()` block) has checks forced on when that one had
    them on: the user's off switch decides once, for the whole `check`."""
    import contextlib

    from .. import _config
    from .._errors import ShapeWarning
    from .._trace.tracing import tracing
    from .._tracer import Trace

    trace = Trace(mode="warn")
    # Bound to the session once it is open: a forward whose entry fails still has one.
    watch = _probes.Watch(None)
    on = _config.is_enabled() if like is None else like.on
    traced = _Traced(trace, watch, on=on)
    switch = _config.forced_on() if like is not None and on else contextlib.nullcontext()
    try:
        with switch, warnings.catch_warnings():
            warnings.simplefilter("ignore", ShapeWarning)
            with tracing(trace, model, args, kwargs) as session:
                watch.session = session
                with watch:
                    out = model(*args, **kwargs)
                watch.heads.finish(session, model, out)
                first = _probes.first_output(out)
                meta = session.metas.get(first) if first is not None else None
                traced.out_axes = meta.axes if meta is not None else ()
                traced.in_metas = {
                    path: session.metas.get(t) for path, t in _probes.leaves((args, kwargs))
                }
                traced.out_metas = [
                    (path, t, session.metas.get(t))
                    for path, t in _probes.leaves(out)
                    if t.is_floating_point()
                ]
    except Exception as error:
        traced.error = error
    return traced


def _shape_result(traced: _Traced) -> ProbeResult:
    from .._errors import ShapeError

    findings = traced.trace.findings
    if traced.error is not None:
        error = traced.error
        message = (
            error.render() if isinstance(error, ShapeError) else f"{type(error).__name__}: {error}"
        )
        return ProbeResult(
            "shape checks",
            "failed",
            f"the forward fails:\n{message}",
            op=getattr(error, "location", ""),
        )
    if not findings:
        ops = len(traced.trace.events)
        return ProbeResult("shape checks", "passed", f"{ops} ops traced, no finding")
    kinds = ", ".join(sorted({f.kind for f in findings}))
    messages = "\n".join(f.message for f in findings)
    return ProbeResult(
        "shape checks",
        "failed",
        f"{len(findings)} finding(s) ({kinds}):\n{messages}",
        op=findings[0].location,
    )


# -- the probes -------------------------------------------------------------------------
def _subject(work, model, args, kwargs, traced: _Traced, causal, seed, report):
    """The float64 copy, its inputs and reference outputs, for the probes; or a result
    saying why the probes cannot run."""
    import inspect

    import torch

    from . import intent
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
    _avoid_pad_ids(work, layout)
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
    """The RNG pin on `model` (`run_check` puts it there before the probes); a caller
    that builds a subject on its own copy (bench/check_probe.py) gets one put there now,
    so the reference run and every probe run start from one RNG state all the same."""
    from .runs import Pin

    found = next((h for h in model._forward_pre_hooks.values() if isinstance(h, Pin)), None)
    return found if found is not None else pin(model, seed)


def _avoid_pad_ids(model, layout) -> None:
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
    again = _trace(work, args2, kwargs2, like=traced)
    if again.error is not None:
        first = str(again.error).strip().splitlines()
        return f"the module fails on it ({first[0] if first else type(again.error).__name__})"
    try:
        subject = _subject(work, model, args2, kwargs2, again, causal, seed, CheckReport(""))
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
    from .layout import padded_once, read_layout, settle_pending

    inputs = padded_once(layout, (args, kwargs), pending)
    retraced = _trace(work, *inputs, like=traced)
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

    from .._trace.tracing import run_observed

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


def _run_probe(probe, subject) -> ProbeResult:
    """One probe's result, judged: a failure needs a counterexample the module runs, in
    the dtype it was given where the float64 copy disagrees; anything less is
    inconclusive, with its reason."""
    name = NAMES.get(probe, probe.__name__.replace("_", " "))
    result, rejected = _attempt(probe, subject, name)
    if subject.as_given is not None and (result.status == FAILED or rejected):
        result = _as_given(probe, subject, name, result, rejected)
    if subject.void:
        return demoted(result, subject.void)
    if subject.random and result.status == FAILED:
        return demoted(result, subject.random)
    return result


def _attempt(probe, subject, name: str) -> tuple[ProbeResult, bool]:
    """(the probe's result, whether the module rejected the probe's input). The module's
    own error on an edited input and a crash of the probe's code are inconclusive."""
    from .locate import locate_crash

    try:
        return probe(subject), False
    except Rejected as rejected:
        op, relation = ("", "")
        if rejected.inputs is not None:
            op, relation = locate_crash(subject, rejected.inputs)
        what = f" ({rejected.what})" if rejected.what else ""
        where = f"\n  raised at {op}" if op else ""
        message = (
            f"the module rejects the probe's input{what}: "
            f"{relation or first_line(rejected.error)}{where}\n"
            "  an input the module does not run is no counterexample"
        )
        return inconclusive(name, message, op=op), True
    except Exception as error:  # a probe must not take the report down
        return inconclusive(name, _own_crash(error)), False


def _as_given(probe, subject, name: str, result: ProbeResult, rejected: bool) -> ProbeResult:
    """The probe again in the dtype the module was given, where the float64 copy failed
    or was rejected: a module can compute differently in float64 (a mask of
    finfo(float64).min that adds to -inf, a float32 buffer that does not take float64
    data); its users run it as given."""
    try:
        given = subject.as_given()
        again, _ = _attempt(probe, given, name) if given is not None else (None, False)
    except Exception:
        return result
    if again is None or not again.conclusive:
        return result
    if again.status == FAILED and not rejected:
        return result  # failed both ways: the float64 copy's message stands
    dtype = str(given.reference.dtype).removeprefix("torch.")
    first = result.message.splitlines()[0]
    how = "differs" if not rejected else "is rejected"
    head, *rest = again.message.split("\n", 1)
    head += f" (in {dtype}, as given; the float64 copy {how}: {first})"
    again.message = "\n".join([head, *rest])
    return again
