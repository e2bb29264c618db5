"""The one path from a broken rule to the user: recorded as a finding, raised, or warned.

The session's rules, contracts and flash-attn's contract outside a trace all report
through `deliver`, so the three agree on what a mode, `strict`, a `# shapeguard:
ignore[kind]` comment and a repeated warning do.
"""

import warnings
from typing import Protocol

from . import _ranks, _suppress
from ._errors import ShapeError, ShapeWarning


class Recorder(Protocol):
    """Where findings go (a trace): the kept ones, and the ones silenced on their line."""

    def add_finding(self, error: ShapeError, severity: str = "error") -> None: ...
    def add_suppressed(self, error: ShapeError, severity: str = "error") -> None: ...


def deliver(
    error: ShapeError,
    severity: str,
    *,
    mode: str,
    strict: bool = False,
    trace: Recorder | None = None,
    filename: str = "<shapeguard>",
    lineno: int = 0,
    once: set | None = None,
    registry: dict | None = None,
) -> ShapeError | None:
    """Record `error` in `trace`, then raise it (an error, or any finding under `strict`,
    in "raise" mode) or warn at the user's line (`filename`, `lineno`).

    A kind silenced by a comment on its line is recorded as suppressed and goes no
    further. `once` (a set the caller keeps) warns once per (kind, location); `registry`
    is `warnings.warn_explicit`'s. Returns the error when it is one that was only warned
    (if torch then fails on the op, that is the error to raise), else None.
    """
    __tracebackhide__ = True
    silenced = error.kind in _suppress.kinds_ignored(error.location)
    if trace is not None:
        (trace.add_suppressed if silenced else trace.add_finding)(error, severity)
    if silenced:
        return None
    if (severity == "error" or strict) and mode == "raise":
        try:
            raise error
        finally:
            # The traceback holds this frame: with `error` still in it, error -> traceback
            # -> frame -> error would be a cycle, and everything the frames below hold (the
            # session, the user's tensors) would wait for a full collection.
            del error
    found = error if severity == "error" else None
    if once is not None:
        key = (error.kind, error.location)
        if key in once:
            return found
        once.add(key)
    warnings.warn_explicit(
        # On one rank of several, `[rank r/N] ` first: the ranks' warnings tell apart.
        ShapeWarning(_ranks.prefix() + error.render(), kind=error.kind, hint=error.hint),
        ShapeWarning,
        filename,
        lineno,
        registry=registry,
    )
    return found
