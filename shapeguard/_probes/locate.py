"""Where a failed probe's difference first appears: the traced op and its line."""

import contextlib

import torch

from .compare import deviation, scale_of
from .edits import take
from .subject import Subject
from .watch import Watch

TOKEN_AXES = ("seq", "seq_q", "seq_k")  # the names the trace gives token axes


def record_values(s: Subject, inputs, *, mode: str = "warn") -> list[tuple]:
    """Every op's output in one traced forward: (op, where, value, axis names)."""
    import warnings

    from .. import _config
    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    args, kwargs = inputs
    with _config.forced_on(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with recording_session(Trace(mode=mode), s.model, args, kwargs) as session:
            watch = Watch(session, keep_values=True)
            with watch:
                s.model(*args, **kwargs)
    return watch.values or []


def traced_findings(s: Subject, inputs) -> list:
    """The findings of one traced forward on `inputs` (warn mode: every finding)."""
    import warnings

    from .. import _config
    from .._errors import ShapeWarning
    from .._public_trace import Trace
    from .._trace.opening import recording_session

    args, kwargs = inputs
    trace = Trace(mode="warn")
    with _config.forced_on(), warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        # A rule's error in warn mode is a finding already; torch's own is the step's.
        with recording_session(trace, s.model, args, kwargs), contextlib.suppress(Exception):
            s.model(*args, **kwargs)
    return trace.findings


def locate(s: Subject, inputs_a, inputs_b, region) -> str:
    """The first traced op whose output differs, in the region the probe says must not."""
    try:
        first, second = record_values(s, inputs_a), record_values(s, inputs_b)
    except Exception:
        return ""
    for (op_a, where, a, axes), (op_b, _, b, _) in zip(first, second, strict=False):
        if op_a != op_b:
            return ""  # the two runs took different paths: no op-by-op comparison
        pair = region(a, b, axes)
        if pair is not None and deviation(pair[0], pair[1], scale_of(a)) > s.rtol:
            return where
    return ""


def locate_crash(s: Subject, inputs) -> tuple[str, str]:
    """Rerun a failing forward under shapeguard: (the op and line, the broken relation)."""
    from .._errors import ShapeError

    try:
        record_values(s, inputs, mode="raise")
    except ShapeError as error:
        where = f"{error.op} at {error.location}" if error.location else error.op
        return (f"{where} ({error.module})" if error.module else where), error.relation
    except Exception:
        return "", ""
    return "", ""


def _named(axes, names) -> list[int]:
    return [d for d, n in enumerate(axes or ()) if n in names]


def seq_dims(a, axes, length: int) -> list[int]:
    """The sequence axes of an op's output; where none is named (a view that mixed the
    sequence with another axis has no sequence axis left), the unnamed ones of the
    probed length, so the op that broke equivariance can still be pointed at."""
    dims = [d for d in _named(axes, TOKEN_AXES) if a.shape[d] == length]
    if dims:
        return dims
    names = tuple(axes or ()) + (None,) * (a.dim() - len(axes or ()))
    return [d for d in range(a.dim()) if a.shape[d] == length and names[d] is None]


def region_batch(batch: int, keep: list[int]):
    """The examples `keep` along every batch axis of size `batch`."""
    index = torch.tensor(keep)

    def region(a, b, axes):
        dims = [d for d in _named(axes, ("batch",)) if a.shape[d] == batch]
        if not dims or a.shape != b.shape:
            return None
        return take(a, dims[0], index), take(b, dims[0], index)

    return region


def region_prefix(name: str, full: int, k: int, *, same_size: bool = False):
    """The first k along every axis called `name` (batch, or any seq axis) of size full;
    the second run has size k there (a shorter run) or full (`same_size`)."""
    names = TOKEN_AXES if name == "seq" else (name,)

    def region(a, b, axes):
        if a.dim() != b.dim():
            return None
        dims = [d for d in _named(axes, names) if a.shape[d] == full]
        if not dims:
            return None
        for d in dims:
            a = a.narrow(d, 0, k)
            if same_size:
                b = b.narrow(d, 0, k)
        return (a, b) if a.shape == b.shape else None

    return region


def region_padding(length: int, padded: list[int]):
    """The real tokens: every seq axis of size `length` without the `padded` positions
    (on the right, the left or anywhere)."""
    keep = torch.tensor([p for p in range(length) if p not in set(padded)])

    def region(a, b, axes):
        dims = seq_dims(a, axes, length)
        if not dims or a.shape != b.shape:
            return None
        for d in dims:
            a, b = take(a, d, keep), take(b, d, keep)
        return a, b

    return region


def region_permuted(length: int, perm: torch.Tensor):
    """The first run permuted by `perm` along every seq axis of size `length`."""

    def region(a, b, axes):
        dims = seq_dims(a, axes, length)
        if not dims or a.shape != b.shape:
            return None
        for d in dims:
            a = take(a, d, perm)
        return a, b

    return region
