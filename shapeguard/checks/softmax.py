"""softmax over an axis other than seq_k: legal, almost always a bug (a ShapeWarning).

The tensor must be scores by structure: made by a query-key product (its role), or with
query and key axes that attention itself named (not a model input's usual layout). Where
softmax already runs along the last axis and the product laid the keys elsewhere (an einsum
written `... -> ... j i`), the product is what to fix, and the hint says so.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names.dims import TOKEN
from .._names.flow.products import keys_first_einsum
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
    looks_like_scores = role == "scores" or _attended(call, x, axes)
    wrong = (name in _WRONG_AXES and looks_like_scores) or (
        name is None and role == "scores" and dim != ndim - 1
    )
    if not wrong:
        return
    axis = name or f"dim {dim - ndim}"
    hint = f"use softmax({label}, dim=-1) for scores laid out as [batch, heads, seq_q, seq_k]"
    if dim == ndim - 1 and keys_axis != ndim - 1:
        hint = _keys_elsewhere_hint(call, x, axes, label, keys_axis - ndim)
    yield Violation(
        "softmax_axis",
        f"softmax over {axis} (dim {dim - ndim}) of {label}: each query's weights must sum to 1 "
        f"over the keys ({axes[keys_axis] if axes and axes[keys_axis] else 'the last axis'})",
        (call.operand(label, x),),
        hint,
        severity="warning",
    )


def _attended(call, x, axes) -> bool:
    """Whether `x` has a query and a key axis that structure named (attention ran along
    them), not the usual layout of two inputs read as queries and keys."""
    found = [i for i, n in enumerate(axes or ()) if n in ("seq_q", "seq_k")]
    names = {axes[i] for i in found}
    return names == {"seq_q", "seq_k"} and all(call.kind(x, i, strong=True) == TOKEN for i in found)


def _keys_elsewhere_hint(call, x, axes, label: str, keys: int) -> str:
    """softmax already runs along dim -1, and the product that made `x` put the keys at
    `keys`: the product's output is what to change, not the softmax."""
    layout = ", ".join(n or "?" for n in axes)
    dims = call.dims(x)
    queries = next((i for i, n in enumerate(axes) if n == "seq_q"), None)
    made = keys_first_einsum(dims[queries], dims[keys]) if queries is not None else None
    if made is not None:
        equation, fixed = made
        return (
            f"{label} is [{layout}]: the einsum '{equation}' that made it puts the keys at dim "
            f"{keys} and the queries last; write '{fixed}' and keep softmax(..., dim=-1)"
        )
    return (
        f"{label} is [{layout}]: the product that made it puts the keys at dim {keys}; make it "
        "return [..., seq_q, seq_k] (an einsum's output letters: the queries' letter, then the "
        "keys') and keep softmax(..., dim=-1)"
    )
