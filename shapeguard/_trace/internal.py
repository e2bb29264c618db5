"""shapeguard's own failures, contained: the user's program runs as without shapeguard.

An exception raised by shapeguard's own code while it checks or records an op (a bug in
a rule, in naming, in recording or replaying, in the module hooks) is caught where it
happens, by the code that knows whether the op ran yet: the op then runs (or its result
is returned) exactly as without shapeguard, and the failure is kept on the trace
(`Trace.internal_errors`, text only) and shown once per place in shapeguard and error
type as a `ShapeguardInternalWarning`. A warning filter that makes that warning an error
only silences it: a shapeguard bug never fails the user's run, `-W error` included.

What shapeguard raises on purpose passes: its findings (`ShapeError`, a `ShapeWarning`
made an error by a filter), a `ContractError`, and `InternalError` itself.

`SHAPEGUARD_INTERNAL_ERRORS=raise` (shapeguard's own test suite sets it) raises an
`InternalError` from the failure instead, so a bug cannot pass the suite unseen. It is a
RuntimeError: a TypeError raised inside `__torch_function__` is turned into
`NotImplemented` by torch's operators, which would hide it (`t * np.float64(2)` then
returns what NumPy's reflected operator makes).

The containing code pays nothing while nothing fails: a `try` costs nothing in CPython
3.11, and this module is called only on a failure.
"""

import contextlib
import os
import warnings

from .. import _config
from .._errors import (
    ContractError,
    InternalError,
    ShapeError,
    ShapeguardInternalWarning,
    ShapeWarning,
)
from .record import InternalFailure

# Raised on purpose: findings, a ShapeWarning a filter made an error, a wrong call of the
# API, and the suite's InternalError (from an inner session, passing an outer one).
_DELIBERATE = (ShapeError, ShapeWarning, ContractError, InternalError)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (where, error type, raised at) already warned in this process.
_warned: set[tuple[str, str, str]] = set()


def contained(trace, error: BaseException, where: str, op: str = "", site=None) -> bool:
    """Whether `error`, raised by shapeguard's own code (`where`: "rule <family>.<name>",
    "recording", ...) on `op`, is contained: then it is kept on `trace` and warned once, and
    the caller goes on as without shapeguard. False for what shapeguard raises on purpose
    (the caller re-raises it). Under `SHAPEGUARD_INTERNAL_ERRORS=raise`, raises an
    `InternalError` from it."""
    if isinstance(error, _DELIBERATE) or not isinstance(error, Exception):
        return False
    location = getattr(site, "location", "") or ""
    failure = InternalFailure(
        where=where,
        op=op,
        error=f"{type(error).__name__}: {_first_line(error)}",
        raised_at=_raised_at(error),
        location=location,
    )
    if trace is not None:
        trace.add_internal(failure)
    if _config.internal_errors_raise():
        raise InternalError(f"shapeguard: {failure.message}") from error
    _warn_once(failure, type(error).__name__, site)
    return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


def _raised_at(error: BaseException) -> str:
    """file:line of the innermost frame in shapeguard that the error passed through (the
    innermost frame of all when none is): where to look for the bug."""
    found = last = ""
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        here = f"{code.co_filename}:{tb.tb_lineno}"
        last = here
        if code.co_filename.startswith(_PACKAGE + os.sep):
            found = here
        tb = tb.tb_next
    place = found or last
    if place.startswith(_PACKAGE + os.sep):
        place = "shapeguard" + place[len(_PACKAGE) :]
    return place or "?"


def _warn_once(failure: InternalFailure, kind: str, site) -> None:
    key = (failure.where, kind, failure.raised_at)
    if key in _warned:
        return
    _warned.add(key)
    message = (
        f"shapeguard failed internally and skipped this check: {failure.message}. The op ran "
        "exactly as without shapeguard. Please report this message (the trace keeps every "
        "such failure in trace.internal_errors)."
    )
    # A filter that makes it an error (`-W error`), or a showwarning hook that fails, only
    # silences it: a shapeguard bug must not fail the user's run. The trace keeps it.
    with contextlib.suppress(Exception):
        warnings.warn_explicit(
            ShapeguardInternalWarning(message),
            ShapeguardInternalWarning,
            getattr(site, "filename", None) or "<shapeguard>",
            getattr(site, "lineno", None) or 0,
        )
