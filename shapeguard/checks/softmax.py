"""softmax over an axis other than seq_k: legal, almost always a bug (a ShapeWarning).

The tensor must be scores by structure: made by a query-key product (its role), or with
query and key axes that attention itself named (not a model input's usual layout). Which
axis holds the queries and which the keys is what the product said (`weights.side_of`),
whatever the tokens are called (seq, height*width, frames). Where softmax already runs
along the last axis and the product laid the keys elsewhere (an einsum written
`... -> ... j i`), the product is what to fix, and the hint says so. A softmax over
queries that are no keys (cross-attention, slot attention's slots) is left to the product
with V, which sees whether the weights were renormalised over the keys in between.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names.dims import TOKEN
from .._names.flow.products import keys_first_einsum
from .._names.flow.weights import side_of
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
    looks_like_scores = role == "scores" or _attended(call, x, axes)
    meta = call.meta_of(x)
    sides = [side_of(meta, i) if looks_like_scores else None for i in range(ndim)]
    if sides[dim] == "k":
        return  # the keys, wherever the product laid them
    if sides[dim] == "q" and _cross(meta, dim, sides):
        # Queries that are no keys (slot attention's slots) may compete for the keys: a
        # softmax over them is right where the weights are renormalised over the keys
        # after it, so the product with V judges (`checks/aggregation.py`).
        return
    keys_axis = _keys_axis(axes, sides, ndim)
    wrong = (
        sides[dim] == "q"
        or (name in _WRONG_AXES and looks_like_scores)
        or (name is None and role == "scores" and dim != ndim - 1)
    )
    if not wrong:
        return
    axis = name or f"dim {dim - ndim}"
    if sides[dim] == "q" and name != "seq_q":
        axis = f"the queries' {name}" if name else "the queries"
    keys = axes[keys_axis] if axes and axes[keys_axis] else "the last axis"
    if sides[keys_axis] == "k" and keys != "seq_k":
        keys = f"{keys}, dim {keys_axis - ndim}"
    hint = f"use softmax({label}, dim=-1) for scores laid out as [batch, heads, seq_q, seq_k]"
    if dim == ndim - 1 and keys_axis != ndim - 1:
        hint = _keys_elsewhere_hint(call, x, axes, label, keys_axis - ndim, sides)
    yield Violation(
        "softmax_axis",
        f"softmax over {axis} (dim {dim - ndim}) of {label}: each query's weights must sum to 1 "
        f"over the keys ({keys})",
        (call.operand(label, x),),
        hint,
        severity="warning",
    )


def _keys_axis(axes, sides: list, ndim: int) -> int:
    """Where the keys are: the axis the query-key product made its columns, else the one
    named seq_k, else the last."""
    if "k" in sides:
        return sides.index("k")
    return next((i for i, n in enumerate(axes or ()) if n == "seq_k"), ndim - 1)


def _cross(meta, dim: int, sides: list) -> bool:
    """Whether the queries along `dim` are no keys: the keys' axis shares no root with it."""
    if "k" not in sides:
        return False
    queries, keys = meta.dims[dim], meta.dims[sides.index("k")]
    shared = {id(r) for r in D.roots_of(queries)} & {id(r) for r in D.roots_of(keys)}
    return bool(queries) and bool(keys) and not shared


def _attended(call, x, axes) -> bool:
    """Whether `x` has a query and a key axis that structure named (attention ran along
    them), not the usual layout of two inputs read as queries and keys."""
    found = [i for i, n in enumerate(axes or ()) if n in ("seq_q", "seq_k")]
    names = {axes[i] for i in found}
    return names == {"seq_q", "seq_k"} and all(call.kind(x, i, strong=True) == TOKEN for i in found)


def _keys_elsewhere_hint(call, x, axes, label: str, keys: int, sides: list) -> str:
    """softmax already runs along dim -1, and the product that made `x` put the keys at
    `keys`: the product's output is what to change, not the softmax."""
    layout = ", ".join(n or "?" for n in axes)
    dims = call.dims(x)
    queries = (
        sides.index("q")
        if "q" in sides
        else next((i for i, n in enumerate(axes) if n == "seq_q"), None)
    )
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
