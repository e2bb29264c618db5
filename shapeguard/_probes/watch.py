"""What one traced forward tells the probes: causal, masked, positional, its projections."""

import torch

from .. import _ops
from ..checks import mask_semantics
from ..checks.mask_semantics import aligned, mask_uses, triangle
from .tree import first_output

# The ops whose masks `mask_uses` reads: the only ones worth building an OpCall for.
_MASKING_OPS = frozenset(s for op in mask_semantics.MASKING for s in op.spellings)
# Ops that make a positional term, and ops that read one out of a table (op table flags).
_POSITIONAL_OPS = _ops.spellings_where(positional=True)
_TABLE_READS = _ops.spellings_where(reads_table=True)
_LINEAR = _ops.by_name("linear")


class Watch:
    """Notes, while a shapeguard session traces one forward, what the probes need to
    know: whether the module is causal, masked or positional, which Linears make Q, K,
    V and read the context, and (for locating a failure) every op's output."""

    def __init__(self, session, *, keep_values: bool = False) -> None:
        from torch.overrides import TorchFunctionMode

        from .._session import op_name

        watch = self
        skip = _ops.family_ops(_ops.QUERY)
        self.session = session
        self.causal = ""  # why the module is causal, when it is
        self.masked = ""  # where a mask is applied
        self.positional = ""  # where a positional term is computed
        self.linears: list[tuple] = []  # (module, input role, output role)
        self.values: list[tuple] | None = [] if keep_values else None

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                op = op_name(func)
                if op in skip:
                    return func(*args, **kwargs)
                count = len(watch.session.trace.events)
                watch._before(func, op, args, kwargs)
                out = func(*args, **kwargs)
                watch._after(op, args, out, count)
                return out

        self.mode = _Mode()

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def _where(self, count: int, op: str) -> str:
        events = self.session.trace.events
        if len(events) > count and events[-1].op == op:
            return describe_event(events[-1])
        return op

    def _before(self, func, op: str, args, kwargs) -> None:
        if op not in _MASKING_OPS:
            return
        from .._session import OpCall

        call = OpCall(self.session, func, op, args, kwargs, None)
        if call.bound().get("is_causal") is True and not self.causal:
            self.causal = f"{op}(is_causal=True)"
        for use in mask_uses(call):
            self.masked = self.masked or use.op
            hidden = aligned(use.hidden, len(use.target))
            square = hidden.shape[-2:] == use.target[-2:] and min(use.target[-2:]) > 1
            if square and not self.causal and triangle(hidden):
                self.causal = f"a triangular mask in {use.op}"

    def _after(self, op: str, args, out, count: int) -> None:
        session = self.session
        if op in _POSITIONAL_OPS or (op in _TABLE_READS and _reads_a_table(session, args)):
            self.positional = self.positional or self._where(count, op)
        if _ops.declared(op) is _LINEAR and session.module_stack and isinstance(out, torch.Tensor):
            meta_in, meta_out = session.metas.get(args[0]), session.metas.get(out)
            self.linears.append(
                (
                    session.module_stack[-1],
                    meta_in.role if meta_in else None,
                    meta_out.role if meta_out else None,
                )
            )
        out = first_output(out)  # nn.MultiheadAttention's op returns (output, weights)
        if self.values is not None and out is not None:
            meta = session.metas.get(out)
            axes = meta.axes if meta else ()
            self.values.append((op, self._where(count, op), out.detach().clone(), axes))


def _reads_a_table(session, args) -> bool:
    """Indexing a parameter or a module buffer: a position table, usually."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    table = args[0]
    if isinstance(table, torch.nn.Parameter):
        return True
    meta = session.metas.get(table)
    if meta is not None:
        return bool(meta.buffer)
    return any(buf is table for module in session.module_stack for buf in module._buffers.values())


def describe_event(event) -> str:
    """`view at model.py:12 (blocks.0.attn)`: how a failed probe names a traced op."""
    where = f"{event.op} at {event.location}" if event.location else event.op
    module = event.module or event.module_type
    return f"{where} ({module})" if module else where
