"""`shapeguard.check`: trace a module once, then run the semantic probes on a copy.

The trace reports what the checks find (loud and silent bugs at their lines) and
keeps the axis provenance of every input and output; the probes read the inputs'
roles from it, then test properties that only running the module can show (batch
independence, causality, key padding, token and head permutations, length change,
decode consistency with the module's cache). Nothing of the caller's changes: the
module is copied (float64 where it can be), and the RNG states, train/eval modes
and requires_grad flags are restored even if a probe fails. See docs/check.md.
"""

from .. import _probes
from . import ProbeResult
from .prepare import prepare_subject
from .report import SCHEMA_VERSION as SCHEMA_VERSION
from .report import CheckReport as CheckReport
from .result import FAILED, INCONCLUSIVE, PASSED, demoted, inconclusive
from .runs import Rejected, describe_crash, first_line, pin
from .traced import Traced, shape_result, trace_for_probes
from .untouched import untouched

PROBES = (
    _probes.batch_independence,
    _probes.sub_batch,
    _probes.causality,
    _probes.key_padding,
    _probes.token_permutation,
    _probes.node_relabelling,
    _probes.head_permutation,
    _probes.length_change,
    _probes.decode_consistency,
    _probes.measured_reach,
)
# Each probe's name in the report (its results say it too; a probe that crashes does not).
NAMES = {
    _probes.batch_independence: "batch independence",
    _probes.sub_batch: "sub-batch consistency",
    _probes.causality: "causality",
    _probes.key_padding: "key-padding invariance",
    _probes.token_permutation: "token-permutation equivariance",
    _probes.node_relabelling: "node-relabelling equivariance",
    _probes.head_permutation: "head-permutation invariance",
    _probes.length_change: "length change",
    _probes.decode_consistency: "decode consistency",
    _probes.measured_reach: "reach",
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
    return run_probes(model, inputs, kwargs, causal=causal, seed=seed)


def run_probes(
    model,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    causal: bool | None = None,
    seed: int = 0,
) -> CheckReport:
    """`check` with the inputs as a tuple and a dict (for the CLI and the pytest plugin)."""
    import torch

    from .._errors import ContractTypeError

    if not isinstance(model, torch.nn.Module):
        raise ContractTypeError(f"shapeguard.check takes an nn.Module, not {type(model).__name__}")
    args, kwargs = tuple(args), dict(kwargs or {})
    report = CheckReport(type(model).__name__)
    modules = list(model.modules())
    report.training = (sum(m.training for m in modules), len(modules))
    with untouched(model) as work, torch.no_grad():
        traced = trace_for_probes(work, args, kwargs)
        report.findings = traced.trace.findings
        report.results.append(shape_result(traced))
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
    """Run every probe on the subject `prepare_subject` makes, into `report`."""
    from .. import _config

    # Probe runs are plain forwards, guarded or not (the traced re-runs some probes ask
    # for switch checks back on for themselves: _probes.locate).
    with _config.disabled():
        try:
            subject = prepare_subject(work, model, args, kwargs, traced, causal, seed, report)
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
        _weigh_reach(report)
        _hear_attention(subject, report, (work, args, kwargs, traced, causal, seed))
        _weigh_reach(report)  # again: a reach measured inside, against the probes there


def _cannot_probe(traced: "Traced", inputs) -> ProbeResult | None:
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


# The probe that edits for the invariant a reach counterexample breaks, as a whole.
_WHOLE = {"batch": _probes.batch_independence, "padding": _probes.key_padding}


def _weigh_reach(report: CheckReport) -> None:
    """A reach failure on batch or padding where the probe that edits for that invariant
    as a whole did not fail is inconclusive, with both measurements: that probe found the
    padded inputs reach the real tokens outside attention (a convolution, a compressor),
    where no mask promises to hide them, or saw no dependence beyond its tolerance where
    one redrawn cell moved another example (a batch-wide statistic). A false failure is
    worse than a missed one."""
    reach = next((r for r in report.results if r.name == NAMES[_probes.measured_reach]), None)
    if reach is None or reach.status != FAILED or reach.reach is None:
        return
    whole = _WHOLE.get(reach.reach.broken)
    other = next((r for r in report.results if whole and r.name == NAMES[whole]), None)
    if other is None or other.status not in (PASSED, INCONCLUSIVE):
        return
    said = other.message.splitlines()[0] if other.message else other.status
    why = (
        f"{reach.message.splitlines()[0]}; but {other.name} "
        f"{'passed' if other.status == PASSED else 'is inconclusive'} ({said}): the two "
        "measurements disagree, so neither is a counterexample"
    )
    index = report.results.index(reach)
    kept = inconclusive(reach.name, why, deviation=reach.deviation)
    kept.reach = reach.reach
    report.results[index] = kept


# The probes measured again where the attention's effect stops, when the output is deaf.
INNER = (
    _probes.batch_independence,
    _probes.sub_batch,
    _probes.token_permutation,
    _probes.length_change,
    _probes.measured_reach,
)


def _hear_attention(subject, report: CheckReport, given: tuple) -> None:
    """Where the outputs do not depend on the attention (`liveness`), the passed probes
    prove nothing about it: those of `INNER` run again on the tensors where its effect
    stops (`inner.py`), and say so; the rest, and those that cannot, are inconclusive."""
    from .liveness import cut_off, deaf

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
    if not why:
        return
    passed = {r.name for r in report.results[1:] if r.status == PASSED}
    inner, where = ("", "")
    if any(NAMES[p] in passed for p in INNER):
        inner, where = _inner(subject, given)
    because = f"the output does not depend on the attention ({cut_off(subject.model)})"
    for i, result in enumerate(report.results[1:], start=1):
        if result.status != PASSED:
            continue
        probe = next((p for p in INNER if NAMES[p] == result.name), None)
        if probe is None or isinstance(inner, str):
            reason = f"{why}; {inner}" if probe is not None and inner else why
            report.results[i] = demoted(result, reason)
            continue
        again = _run_probe(probe, inner)
        if again.conclusive:
            head, *rest = again.message.split("\n", 1)
            head += f"; measured on {where}, because {because}"
            again.message = "\n".join([head, *rest])
            report.results[i] = again
        else:
            said = again.message.splitlines()[0]
            report.results[i] = demoted(result, f"{why}; measured on {where}: {said}")


def _inner(subject, given: tuple):
    """(the subject measured where the attention's effect stops, those places in words),
    or (why there is none, "")."""
    from .inner import inner_subject, where
    from .liveness import live_points

    work, args, kwargs, traced, causal, seed = given
    try:
        points = live_points(subject)
        if not points:
            return "no module's input or output moves with the attention either", ""
        made = inner_subject(work, args, kwargs, points, traced, causal, seed)
    except Exception as error:
        return f"probing inside the block failed ({_own_crash(error)})", ""
    if isinstance(made, str):
        return f"the tensors the attention moves ({where(points)}) cannot be probed: {made}", ""
    return made, where(points)


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
