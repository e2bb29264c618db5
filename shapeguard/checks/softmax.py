"""softmax over an axis other than seq_k: legal, almost always a bug (a ShapeWarning)."""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from . import WARNING, rule
from ._view import CallView

_WRONG_AXES = ("seq_q", "heads", "batch", "d_k", "kv_heads", "d_model")


@rule(
    _ops.by_name("softmax"), _ops.by_name("log_softmax"), kinds={"softmax_axis": WARNING}, order=1
)
def softmax_over_keys(call: CallView) -> Iterator[Violation]:
    args = call.args
    if not args or not hasattr(args[0], "dim"):
        return
    x = args[0]
    dim = args[1] if len(args) > 1 else call.kwargs.get("dim")
    if not isinstance(dim, int) or x.dim() < 2:
        return
    ndim = x.dim()
    dim = dim % ndim
    axes = call.axes(x)
    label = call.label(0, "input")
    role = call.role(x, label)
    name = axes[dim] if axes else None
    keys_axis = (
        next((i for i, n in enumerate(axes) if n == "seq_k"), ndim - 1) if axes else ndim - 1
    )
    looks_like_scores = role == "scores" or (axes and "seq_k" in axes and "seq_q" in axes)
    wrong = (name in _WRONG_AXES and looks_like_scores) or (
        name is None and role == "scores" and dim != ndim - 1
    )
    if not wrong:
        return
    axis = name or f"dim {dim - ndim}"
    yield Violation(
        "softmax_axis",
        f"softmax over {axis} (dim {dim - ndim}) of {label}: each query's weights must sum to 1 "
        f"over the keys ({axes[keys_axis] if axes and axes[keys_axis] else 'the last axis'})",
        (call.operand(label, x),),
        f"use softmax({label}, dim=-1) for scores laid out as [batch, heads, seq_q, seq_k]",
        severity="warning",
    )
