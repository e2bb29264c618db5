"""`shapeguard.trace`: check and record every tensor op of a block or of one forward."""

from . import _config
from ._trace.record import TraceData


def trace(
    model=None,
    /,
    *args,
    mode: str = "raise",
    strict: bool = False,
    max_events: int = 100_000,
    **kwargs,
) -> "Trace":
    """Trace a block of code, or one forward of `model`.

    With no model, returns a `Trace` to use as a context manager: every torch
    function, Tensor method and operator inside the block is checked and recorded,
    in any code, guarded or not. With a model, runs `model(*args, **kwargs)` once
    inside a trace and returns the finished Trace (shapes only: keep the output
    by calling the model yourself inside `with shapeguard.trace():`).

    Args:
        model: an `nn.Module` (or any callable) to run once; omit for a context manager.
        *args, **kwargs: the inputs of that forward.
        mode: "raise" or "warn", as for `guard`.
        strict: turn ShapeWarnings into errors.
        max_events: events kept at most; the ops past them are still checked, and
            counted in `dropped_events` (findings are bounded too: a finding repeated by
            later forwards is counted in its `count`).

    Examples:
        >>> import torch, shapeguard
        >>> t = shapeguard.trace(torch.nn.Linear(3, 4), torch.zeros(2, 3))
        >>> t.shape_of("output") is None, t.events[0].op, t.events[0].outputs[0].shape
        (True, 'linear', (2, 4))
    """
    record = Trace(
        mode=_config.validate_mode(mode),
        strict=_config.validate_strict(strict),
        max_events=_config.validate_max_events(max_events),
    )
    if model is None:
        if args or kwargs:
            from ._errors import ContractTypeError

            raise ContractTypeError("shapeguard.trace() takes inputs only together with a model")
        return record
    if not _config.is_enabled():
        model(*args, **kwargs)
        return record
    from ._trace import replay as _replay
    from ._trace.opening import recording_session

    # A model given to trace() is an opener: its sessions replay once they repeat.
    root = model if hasattr(model, "named_modules") else None
    with recording_session(record, model, args, kwargs, opener=_replay.opener("model", root)):
        model(*args, **kwargs)
    return record


class Trace(TraceData):
    """What a shapeguard trace saw.

    Use it as a context manager to check every tensor op inside the block::

        with shapeguard.trace() as t:
            model(x)
        print(t.table())

    or get one from `shapeguard.trace(model, x)`, which runs one forward. The data and
    its queries are `TraceData`'s; this class opens the block's session and renders
    (`report`), which the layers below never import.
    """

    # -- context manager ---------------------------------------------------
    def __enter__(self) -> "Trace":
        from . import _source
        from ._trace import replay as _replay
        from ._trace.opening import begin

        # Blocks opened on one line repeat (a test helper, a training loop): see `_trace.replay`.
        where = _source.user_code_position()
        self._session = begin(self, opener=_replay.opener("with", where))
        return self

    def __exit__(self, *exc_info) -> None:
        from ._trace.session import Session, close_session

        session, self._session = self._session, None
        if isinstance(session, Session):
            close_session(session)
        error = exc_info[1] if len(exc_info) > 1 else None
        if isinstance(error, AssertionError):
            from . import _config
            from ._trace.construction import report_construction_error

            # torch's bare AssertionError from nn.MultiheadAttention(1024, 12) in the block:
            # raised as a ShapeError, or warned and then raised (torch has failed).
            enabled = _config.is_enabled()
            shape_error = report_construction_error(error, self) if enabled else None
            if shape_error is not None:
                try:
                    raise shape_error from error
                finally:
                    shape_error = None  # no frame -> error cycle (`_reporting.deliver`)

    # -- rendering -------------------------------------------------------------
    def table(
        self,
        *,
        width: int | None = 150,
        color: bool = False,
        all_ops: bool = False,
        fold: bool = False,
    ) -> str:
        """The attention tensors (or every op, with `all_ops=True`) as a text table; `fold`
        leaves out rows that repeat an earlier layer's (see `report.text.render_table`)."""
        from .report.text import render_table

        return render_table(self, width=width, color=color, all_ops=all_ops, fold=fold)

    def to_html(self, attention: dict | None = None) -> str:
        """One self-contained HTML report (no network): see `shapeguard.report.html`.

        Args:
            attention: per-head attention weights for the heatmaps, as returned by
                `shapeguard.report.html.capture_attention(model, *args)`; a trace itself
                keeps shapes only.
        """
        from .report.html import render_html

        return render_html(self, attention)

    def _repr_html_(self) -> str:
        """The HTML report's flow and table, for a notebook cell (Jupyter calls this)."""
        from .report.html import render_fragment

        return render_fragment(self)

    def __str__(self) -> str:
        return self.table()
