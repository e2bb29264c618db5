"""Reporting a session's findings: a rule's violation, and torch's own failure of an op
explained, through `_reporting.deliver` (mode, strictness, suppressions).
"""

import torch

from .. import _reporting, _source
from .._errors import Context, ShapeError, Violation
from . import internal as _internal
from .call import OpCall
from .meta import NO_FLAGS
from .session_state import SessionState


class Findings(SessionState):
    """A session's findings, delivered (`Session` is one)."""

    def _context(self, call: OpCall) -> Context:
        _, _, module = self.module_description()
        site = call.site
        return Context(
            module=module,
            location=site.location if site else "",
            source=site.source if site else "",
        )

    def report(self, violation: Violation, call: OpCall) -> ShapeError | None:
        """Raise or warn for one violation, and record it as a finding. In warn mode an
        error is returned too: if torch then fails on the op, that is the error to raise."""
        __tracebackhide__ = True
        violation.op = violation.op or call.op
        context = self._context(call)
        site = call.site
        return _reporting.deliver(
            # Not kept in a local: a raised error must not be held by a frame it passes
            # through (`deliver`: the cycle it would make).
            ShapeError.from_violation(violation, context),
            violation.severity,
            mode=self.trace.mode,
            strict=self.trace.strict,
            trace=self.trace,
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
            once=self._warned,
        )

    def _flagged(self, call: OpCall) -> frozenset:
        found: frozenset = NO_FLAGS
        for t in call.tensors():
            meta = call.meta(t)
            if meta is not None and meta.flagged:
                found = found | meta.flagged
        return found

    def _torch_error(self, error: RuntimeError, call: OpCall) -> ShapeError:
        operands = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, torch.Tensor):
                operands.append(call.operand(call.label(i, f"arg{i}"), arg))
            elif isinstance(arg, list | tuple):  # torch.cat([a, b]), torch.stack(...)
                base = call.label(i, f"arg{i}")
                items = _source.sequence_items(call.source_text(i) or "") or []
                operands += [
                    call.operand(items[j] if j < len(items) else f"{base}[{j}]", t)
                    for j, t in enumerate(arg)
                    if isinstance(t, torch.Tensor)
                ]
        operands += [
            call.operand(name, value)
            for name, value in call.kwargs.items()
            if isinstance(value, torch.Tensor)
        ]
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        context = self._context(call)
        shape_error = ShapeError(
            f"{call.op} failed in torch: {first_line}",
            kind="torch_error",
            op=call.op,
            module=context.module,
            location=context.location,
            source=context.source,
            operands=operands,
            hint="shapeguard has no rule for this failure yet; the operand shapes above are "
            "what torch was given",
        )
        self.trace.add_finding(shape_error)
        return shape_error

    def _explain(self, error: RuntimeError, call: OpCall) -> ShapeError | None:
        """`_torch_error`, or None when describing the failure failed (contained: torch's
        own error is raised then)."""
        try:
            return self._torch_error(error, call)
        except Exception as failure:
            if not _internal.contained(
                self.trace, failure, "describing torch's error", call.op, call.site
            ):
                raise
            return None
