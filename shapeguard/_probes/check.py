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
from typing import IO, TYPE_CHECKING, cast

from .. import _probes
from . import ProbeResult

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


SCHEMA_VERSION = 1


@dataclass(slots=True)
class CheckReport:
    """What `check` found: the trace's findings as one result, then one result per probe.

    Attributes:
        model: the module's class name.
        results: `ProbeResult`s (name, status, message, deviation, tolerance, op).
        findings: the trace's `Finding`s.
        dtype: the dtype the probes ran in ("float64" unless the module refused it; ""
            when no probe ran).
    """

    model: str
    results: list[ProbeResult] = field(default_factory=list)
    findings: list = field(default_factory=list)
    dtype: str = ""

    @property
    def passed(self) -> bool:
        """True when no probe failed and the trace found nothing (see `verdict`: a
        report where no probe ran passes, but says so)."""
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> list[ProbeResult]:
        return [r for r in self.results if not r.passed]

    @property
    def probes(self) -> list[ProbeResult]:
        """The semantic probes' results (every result but the trace's)."""
        return [r for r in self.results if r.name != "shape checks"]

    @property
    def verdict(self) -> str:
        """ "failed", "passed", or "not probed" (nothing failed, but no probe ran)."""
        if not self.passed:
            return "failed"
        if not any(r.ran for r in self.probes):
            return "not probed"
        return "passed"

    def summary(self) -> str:
        """The last line of the table: what ran, and the verdict."""
        ran = [r for r in self.results if r.ran]
        skipped = len(self.results) - len(ran)
        where = f" in {self.dtype}" if self.dtype else ""
        more = f", {skipped} skipped" if skipped else ""
        head = f"{len(ran)} of {len(self.results)} checks ran{where}{more}"
        if self.verdict == "failed":
            return f"{head}; failed ({len(self.failed)} of {len(ran)})"
        if self.verdict == "not probed":
            return f"{head}; no probe ran, so only the shape checks passed"
        return f"{head}; passed"

    def render(self, width: int | None = 100, *, color: bool = False) -> str:
        """The report as a table (plain text unless `color`), then each failure in full."""
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"shapeguard check: {self.model}", title_justify="left")
        table.add_column("probe", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("deviation", justify="right", no_wrap=True)
        table.add_column("detail")
        styles = {"passed": "green", "failed": "bold red", "skipped": "dim"}
        for r in self.results:
            dev = "" if r.deviation is None else f"{r.deviation:.1e}"
            detail = r.message.splitlines()[0] if r.status != "failed" else (r.op or "see below")
            status = "n/a" if r.status == "skipped" and not r.applicable else r.status
            table.add_row(r.name, Text(status, style=styles[r.status]), dev, Text(detail))
        console = Console(
            width=width or 100,
            color_system="auto" if color else None,
            force_terminal=color,
            record=True,
            file=cast(IO[str], _Sink()),  # rich only writes to it and flushes it
        )
        console.print(table)
        for r in self.failed:
            console.print(Text(f"{r.name}: {r.message}"), soft_wrap=True)
        console.print(Text(self.summary()))
        return console.export_text(styles=color).rstrip() + "\n"

    def __str__(self) -> str:
        return self.render()

    def to_dict(self) -> dict:
        """The report as JSON-ready values: every probe's result, the trace's findings
        and the verdict (schema "shapeguard.check", docs/json-schema.md)."""
        from .._version import __version__

        counts = {status: 0 for status in ("passed", "failed", "skipped")}
        for r in self.results:
            counts[r.status] = counts.get(r.status, 0) + 1
        return {
            "schema": "shapeguard.check",
            "schema_version": SCHEMA_VERSION,
            "shapeguard_version": __version__,
            "model": self.model,
            "passed": self.passed,
            "verdict": self.verdict,
            "dtype": self.dtype or None,
            "counts": counts,
            "summary": self.summary(),
            "results": [r.to_dict() for r in self.results],
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self, indent: int | None = 2) -> str:
        import json

        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


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
        A `CheckReport`; `report.passed` is False when a probe failed or the trace found
        something, `report.verdict` is "not probed" when no probe ran. Print it for a
        table; `report.to_dict()` for JSON.

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

    from .. import _config
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
        # Probe runs are plain forwards, guarded or not (the traced re-runs some probes
        # ask for switch checks back on for themselves: _probes.locate).
        with _config.disabled():
            try:
                subject = _subject(work, model, args, kwargs, traced, causal, seed, report)
            except Exception as error:
                subject = ProbeResult(
                    "probes", "failed", f"the module fails outside the trace: {error}"
                )
            if isinstance(subject, ProbeResult):
                report.results.append(subject)
                return report
            for probe in PROBES:
                report.results.append(_run_probe(probe, subject))
    return report


# -- leaving the caller's module as it was ----------------------------------------------
@contextmanager
def _untouched(model):
    """A private copy of `model` in eval mode; RNG states, modes and requires_grad
    restored afterwards. Without a copy (deepcopy failed), the module itself,
    with its parameters and buffers restored too."""
    import torch

    rng = torch.get_rng_state()
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
        work.eval()
        yield work
    finally:
        torch.set_rng_state(rng)
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
    """The float64 copy, its inputs and reference outputs, for the probes; or a skipped
    result saying why the probes cannot run."""
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
        return _probes.skipped("probes", "the module takes no tensor input")
    leaf_names = {path: _leaf_name(path, names) for path, _ in found}
    layout = read_layout(found, leaf_names, traced.in_metas, traced.watch, traced.out_metas)
    if isinstance(layout, str):
        return _probes.skipped("probes", layout)
    for pending in layout.pending:
        _settle_pending(work, args, kwargs, layout, pending, leaf_names, traced)
    generator = torch.Generator().manual_seed(seed)
    for dtype in (torch.float64, None):
        try:
            candidate = work if dtype is None else _copy_as(work, dtype)
            inputs = (args, kwargs) if dtype is None else _inputs_as((args, kwargs), dtype)
            output = candidate(*inputs[0], **inputs[1])
        except Exception:
            if dtype is None:
                raise
            continue  # float64 refused (a float32 constant, an op without double): as given
        break
    reference = _probes.first_output(output)
    if reference is None:
        return _probes.skipped("probes", "the module returned no floating-point tensor")
    report.dtype = str(reference.dtype).removeprefix("torch.")
    refs = {}
    for leaf in layout.outputs:
        value = _probes.pick(output, leaf.path)
        if isinstance(value, torch.Tensor):
            refs[leaf.path] = value
    out_batch, out_seq = _first_axes(layout, output, reference)
    if causal is True:
        why = "declared with causal=True"
    elif causal is False:
        why = ""
    else:
        why = traced.watch.causal or intent.declared_causal(work)
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
    refs = {}
    for leaf in subject.layout.outputs:
        value = _probes.pick(output, leaf.path)
        if isinstance(value, torch.Tensor):
            refs[leaf.path] = value
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
    name = probe.__name__.replace("_", " ")
    try:
        result = probe(subject)
    except Exception as error:  # a probe must not take the report down
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return ProbeResult(name, "failed", f"the probe could not run the module: {first}")
    if result.status != "failed" or subject.as_given is None:
        return result
    # The float64 copy failed: confirm in the dtype the module was given. A module can
    # compute differently in float64 (a mask of finfo(float64).min that adds to -inf, a
    # NaN the float32 path never makes); its users run it as given.
    try:
        given = subject.as_given()
        again = probe(given) if given is not None else None
    except Exception:
        return result
    if again is None or again.status != "passed":
        return result
    dtype = str(given.reference.dtype).removeprefix("torch.")
    first = result.message.splitlines()[0]
    again.message += f" (in {dtype}, as given; the float64 copy differs: {first})"
    return again
