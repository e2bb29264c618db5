"""The trace `check` takes before its probes: one forward under shapeguard, with the
axis provenance of its inputs and outputs, and the shape checks' result."""

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _probes
from . import ProbeResult

if TYPE_CHECKING:
    from .._public_trace import Trace
    from .watch import Watch


@dataclass(slots=True)
class Traced:
    trace: "Trace"
    watch: "Watch"
    out_axes: tuple = ()
    error: Exception | None = None
    # The inputs' and outputs' metas when the forward ended (their axis provenance).
    in_metas: dict = field(default_factory=dict)
    out_metas: list = field(default_factory=list)  # (path, tensor, meta) of floating outputs
    on: bool = True  # checks were on for it (so the retraces of its probes are too)
    # (name, tensor, meta) of the module's parameters and buffers the forward read.
    state_metas: list = field(default_factory=list)


def trace_for_probes(model, args: tuple, kwargs: dict, *, like: Traced | None = None) -> Traced:
    """One forward under shapeguard, warnings recorded as findings instead of raised.
    A retrace `like` an earlier trace (a pending mask, a batch of one grown to two, run
    from inside the probes' `disabled()` block) has checks forced on when that one had
    them on: the user's off switch decides once, for the whole `check`."""
    import contextlib

    from .. import _config
    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    trace = Trace(mode="warn")
    # Bound to the session once it is open: a forward whose entry fails still has one.
    watch = _probes.Watch(None)
    on = _config.is_enabled() if like is None else like.on
    traced = Traced(trace, watch, on=on)
    switch = _config.forced_on() if like is not None and on else contextlib.nullcontext()
    try:
        with switch, warnings.catch_warnings():
            warnings.simplefilter("ignore", ShapeWarning)
            with recording_session(trace, model, args, kwargs) as session:
                watch.session = session
                watch.index_flow.seed((args, kwargs))
                with watch:
                    out = model(*args, **kwargs)
                watch.heads.finish(session, model, out)
                first = _probes.first_output(out)
                meta = session.metas.get(first) if first is not None else None
                traced.out_axes = meta.axes if meta is not None else ()
                traced.in_metas = {
                    path: session.metas.get(t) for path, t in _probes.leaves((args, kwargs))
                }
                held = [*model.named_parameters(), *model.named_buffers()]
                traced.state_metas = [
                    (name, t, meta)
                    for name, t in held
                    if (meta := session.metas.get(t)) is not None
                ]
                traced.out_metas = [
                    (path, t, session.metas.get(t))
                    for path, t in _probes.leaves(out)
                    if t.is_floating_point()
                ]
    except Exception as error:
        traced.error = error
    return traced


def shape_result(traced: Traced) -> ProbeResult:
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
    from .._trace.finding_groups import grouped

    kinds = ", ".join(sorted({f.kind for f in findings}))
    # A finding repeated across layers is said once, with the layers it fired in.
    messages = "\n".join(g.message for g in grouped(findings))
    return ProbeResult(
        "shape checks",
        "failed",
        f"{len(findings)} finding(s) ({kinds}):\n{messages}",
        op=findings[0].location,
    )
