"""One traced forward of a picked model, with its trace kept even when the forward fails.

A failure is recorded as the trace's last finding, so the table, the JSON and the
HTML report all show it: a ShapeError the session did not report itself (a
contract, a guard's config check), the model's own crash, or a failure before any
forward ran (`failure_trace`).
"""

import dataclasses
import gc
from dataclasses import dataclass, field

from .._errors import Finding, ShapeError
from .._public_trace import Trace
from .loader import ModelCrashed, error_lines, is_memory_error
from .picking import on_device


@dataclass(slots=True)
class Run:
    """One traced forward: the trace (complete or up to the failure) and what stopped it."""

    trace: Trace
    shape_error: BaseException | None = None
    crash: ModelCrashed | None = None
    warnings: list = field(default_factory=list)
    # The forward ran out of memory (or a size overflowed): what torch said, for a usage error.
    memory: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.shape_error or self.crash or self.trace.errors)


def run_traced(
    model,
    args: tuple,
    kwargs: dict,
    *,
    strict: bool = False,
    path: str = "",
    device: str = "cpu",
    site: str = "",
    prepare=None,
    hold=None,
) -> Run:
    """Run `model(*args, **kwargs)` once under a shapeguard trace and keep the trace even
    when the forward fails (a `shapeguard.trace(model, ...)` call would lose it).

    ShapeWarnings are left to the trace's findings; other warnings are returned,
    so the caller can print them as diagnostics. `strict` stops at the first
    ShapeWarning as at an error. On `device="meta"` the forward runs under
    `torch.device("meta")`, so the tensors it makes without a device (a causal mask
    from `torch.ones(T, T)`) are on meta too, as they would be on cpu.

    The objects that exist before the forward are frozen out of the collector's sight
    (`Freezer`) until it ends, or, given `hold` (a command's Freezer), until the command
    closes it: a command keeps them frozen through its report.
    """
    import logging
    import warnings

    import torch

    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    trace = Trace(mode="raise", strict=strict)
    run = Run(trace)
    freezer = hold if hold is not None else Freezer()
    freezer.freeze()
    # FakeTensorMode logs a full stack at ERROR level before re-raising; the
    # finding says it better (research/prior-art.md section 2.4).
    fake_logger = logging.getLogger("torch._subclasses.fake_tensor")
    previous_level = fake_logger.level
    fake_logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            try:
                with recording_session(trace, model, args, kwargs) as session:
                    if prepare is not None:
                        prepare(session)
                    with torch.no_grad(), on_device(device):
                        model(*args, **kwargs)
            except ShapeError as error:
                run.shape_error = error
                if not any(f.message == error.render() for f in trace.findings):
                    add_error(
                        trace,
                        error.kind,
                        error.render(),
                        op=error.op,
                        module=error.module,
                        location=error.location,
                        hint=error.hint,
                    )
            except Exception as error:
                run.crash = ModelCrashed("forward", error, path)
                run.crash.__cause__ = error
    finally:
        fake_logger.setLevel(previous_level)
        if hold is None:
            freezer.close()
    run.warnings = [w for w in caught if not issubclass(w.category, ShapeWarning)]
    cause = run.crash.error if run.crash else getattr(run.shape_error, "__cause__", None)
    if cause is not None and is_memory_error(cause):
        run.memory = (error_lines(cause) or [type(cause).__name__])[0]
    if site:
        _place(trace, site)
    from .. import _suppress

    _suppress.apply(trace)
    return run


class Freezer:
    """`gc.freeze` for a command, as it is meant to be used: what exists when `freeze` is
    called (torch, the model) moves out of the collector's sight, and each call adds what
    was made since, until `close` gives it all back. The metas and axes a trace keeps set
    off full collections, each of which would otherwise walk every object in the process
    (a tenth of a second each with an 80-layer model). Nothing is frozen when the
    collector is off or someone else froze objects first (then there is nothing of ours
    to give back)."""

    def __init__(self) -> None:
        self.ours: bool | None = None  # decided at the first freeze

    def freeze(self) -> None:
        if self.ours is None:
            self.ours = gc.isenabled() and not gc.get_freeze_count()
        if self.ours:
            gc.freeze()

    def close(self) -> None:
        if self.ours:
            gc.unfreeze()
        self.ours = False


def _place(trace, site: str) -> None:
    """Give the ops and findings no user frame placed the model's own site in the file."""
    for i, event in enumerate(trace.events):
        if not event.location:
            trace.events[i] = dataclasses.replace(event, location=site)
    for finding in trace.findings:
        if not finding.location:
            finding.location = site


def _register_floor() -> None:
    from .._source import stop_at

    stop_at(run_traced.__code__)


def add_error(
    trace, kind: str, message: str, *, op: str = "", module: str = "", location="", hint=""
) -> None:
    """Record an error the session did not report itself, after the trace's last event."""
    trace.findings.append(
        Finding(
            kind=kind,
            severity="error",
            message=message,
            op=op,
            module=module,
            location=location,
            hint=hint,
            event_index=len(trace.events),
        )
    )


def add_crash(trace, crash: ModelCrashed) -> None:
    """The model's own crash as a finding."""
    add_error(
        trace,
        "model_crashed",
        crash.message,
        op=crash.phase,
        location=crash.location,
        hint="an error in the model's own code, not a shape rule",
    )


def failure_trace(kind: str, message: str, location: str, hint: str):
    """A trace holding only the failure that stopped the model before any forward ran
    (importing the file, building the model), for `--json` and `--html`."""
    from .._public_trace import Trace

    trace = Trace()
    add_error(trace, kind, message, location=location, hint=hint)
    return trace


_register_floor()
