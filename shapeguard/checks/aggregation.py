"""Attention weights summed over another axis than the one they sum to 1 along.

Each output of attention is a weighted sum over keys whose weights sum to 1 over those
keys: the axis a softmax normalised must be the axis the product with V contracts. The
softmax notes on its output which side of the query-key product it ran along, and the
ops that keep the weights carry it (`_names/flow/weights.py`); here, at the product, the
weights' contracted axis is of the other side (a ShapeWarning: it runs, and is wrong).
Examples: `"bst,bcs->bct"` where a legacy QKV attention means `"bts,bcs->bct"`;
`attn.T @ Wh` in a dense graph attention; slot attention's softmax over the slots with
no renormalisation over the inputs before the sum over them.

Claims stand on structure only: the side of each axis is the product's (or, for a graph
attention's node axis broadcast against itself, the softmax's), and the other operand's
contracted axis is those very positions. Where the queries are other positions than the
keys, only weights normalised over the queries and summed over the keys are claimed: a
sum over the queries of weights normalised over the keys is how soft k-means updates its
centroids, renormalised after the product, which no rule sees.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names import subscripts
from .._names.dims import TOKEN
from .._names.flow.base import first_tensor
from .._names.flow.weights import side_of
from .._values import is_tensor
from . import WARNING, rule
from ._einsum import written
from ._view import CallView

_MATMUL = _ops.by_name("matmul")


@rule(
    _MATMUL, _ops.by_name("bmm"), _ops.by_name("mm"), kinds={"aggregation_axis": WARNING}, order=1
)
def weights_product(call: CallView) -> Iterator[Violation]:
    """attn @ V (or V^T @ attn^T): the weights' contracted axis is their normalised one."""
    args = call.args
    if len(args) < 2 or not (is_tensor(args[0]) and is_tensor(args[1])):
        return
    a, b = (args[1], args[0]) if call.op in call.spec.reflected else (args[0], args[1])
    if a.dim() < 2 or b.dim() < 2:
        return
    la, lb = call.label(0, "left"), call.label(1, "right")
    if call.op in call.spec.reflected:
        la, lb = lb, la
    for w, lw, c, other, lo, oc in ((a, la, -1, b, lb, -2), (b, lb, -2, a, la, -1)):
        found = _judge(call, w, c, other, oc, [-1 if c == -1 else -2])
        if found is None:
            continue
        n, same = found
        if same:
            moved = " or drop the transpose that laid it out" if call.meta_of(w).laid_out else ""
            swap = (
                f"write {lw}.transpose({n}, {c}) in this product"
                if lw.isidentifier()
                else f"swap its dims {n} and {c} in this product"
            )
            hint = (
                f"sum {lw} over dim {n}, the axis its weights sum to 1 along ({swap}{moved}), "
                f"or normalise {lw} along dim {c} instead"
            )
        else:
            hint = _renormalise_hint(lw, c)
        written_as = f"{la} @ {lb}" if call.spec is _MATMUL else f"{call.op}({la}, {lb})"
        yield _violation(call, written_as, w, lw, n, c, other, lo, hint)
        return


@rule(_ops.by_name("einsum"), kinds={"aggregation_axis": WARNING}, order=1)
def weights_einsum(call: CallView) -> Iterator[Violation]:
    """einsum of the weights and V: the weights' contracted letter is their normalised
    axis's (read from the subscripts, wherever the letters sit)."""
    args = call.args
    if not args or not isinstance(args[0], str):
        return
    operands = list(args[1:]) if len(args) > 2 else list(args[1]) if len(args) == 2 else []
    if len(operands) != 2 or not all(is_tensor(t) for t in operands):
        return
    product = subscripts.product(args[0], [t.dim() for t in operands])
    if product is None or "->" not in args[0] or len(product.contracted) != 1:
        return
    equation = product.equation
    letter = product.contracted
    user = written(call, operands)
    for i in (0, 1):
        w, other, spec = operands[i], operands[1 - i], equation.specs[i]
        other_spec = equation.specs[1 - i]
        c, oc = spec.index(letter), other_spec.index(letter)
        kept = [j - other.dim() for j, x in enumerate(other_spec) if x in equation.out]
        kept = [j for j in kept if other_spec[j] not in spec]
        found = _judge(call, w, c - w.dim(), other, oc - other.dim(), kept)
        if found is None:
            continue
        n, same = found
        lw, lo = user.labels[i], user.labels[1 - i]
        if same:
            specs = list(equation.specs)
            swapped = list(spec)
            swapped[c], swapped[n % w.dim()] = swapped[n % w.dim()], swapped[c]
            specs[i] = "".join(swapped)
            fixed = user.write(equation, specs, equation.out)
            hint = (
                f"write '{fixed}', which sums {lw} over the axis its weights sum to 1 along, "
                f"or normalise {lw} along dim {c - w.dim()} instead"
            )
        else:
            hint = _renormalise_hint(lw, c - w.dim())
        yield _violation(call, f"einsum '{user.equation}'", w, lw, n, c - w.dim(), other, lo, hint)
        return


def _judge(call, w, c: int, other, oc: int, kept: list[int]) -> tuple[int, bool] | None:
    """(the weights' normalised axis, whether it and the contracted one are the same
    positions) when `w` is attention weights whose contracted axis `c` is of the other
    side than the one they sum to 1 along, and `other`'s contracted axis `oc` is those
    very positions (or, across other positions, values given apart from the keys), its
    `kept` axes none of them (V along the keys, a graph's node features; not a [tokens,
    tokens] matrix, as in Nystrom's pseudo-inverse iteration). Axes are negative."""
    meta = call.meta(w)
    if meta is None or not meta.normed:
        return None
    ndim = w.dim()
    sides = [side_of(meta, i) for i in range(ndim)]
    summed = sides[c % ndim]
    if summed is None or summed == meta.normed or sides.count(meta.normed) != 1:
        return None
    n = sides.index(meta.normed)
    contracted = D.normalize(meta.dims[c % ndim])
    if not contracted:
        return None
    same = D.normalize(meta.dims[n]) == contracted
    if not same and meta.normed != "q":
        return None  # a sum over other positions' queries (soft k-means): no claim
    other_dims = call.dims(other)
    paired = other_dims[oc % other.dim()]
    positions = {id(r) for i in (n, c) for r in D.roots_of(meta.dims[i])}
    if D.normalize(paired) != contracted and (
        # Across other positions, values given apart from the keys (not tied to them
        # yet): positions of no other kind at least, and not the queries'.
        same
        or D.strong_kind_of(paired) not in (None, TOKEN)
        or any(id(r) in positions for r in D.roots_of(paired))
    ):
        return None
    if any(id(r) in positions for i in kept for r in D.roots_of(other_dims[i])):
        return None
    return n - ndim, same


def _renormalise_hint(label: str, c: int) -> str:
    # The keys first: a softmax over the queries is cross-attention's bug; slot attention,
    # whose slots compete for the inputs on purpose, is the exception that renormalises.
    return (
        f"take the softmax along the keys (dim {c}), or, where the weights are meant to "
        f"compete over the queries (slot attention), renormalise {label} along dim {c} "
        f"before this product ({label} / {label}.sum(dim={c}, keepdim=True))"
    )


def _violation(call, product: str, w, lw: str, n: int, c: int, other, lo: str, hint: str):
    axes = call.shown_axes(w)
    ndim = w.dim()

    def shown(i: int) -> str:
        name = axes[i] if axes else None
        return f"{name}={w.shape[i]}" if name else f"size {w.shape[i]}"

    return Violation(
        "aggregation_axis",
        f"{product} sums {lw} over dim {c} ({shown(c % ndim)}), but its softmax made it sum "
        f"to 1 over dim {n} ({shown(n % ndim)}): each output must be a weighted sum over the "
        "axis its weights sum to 1 along",
        (call.operand(lw, w), call.operand(lo, other)),
        hint,
        severity="warning",
    )


@rule(_ops.by_name("sum"), _ops.by_name("nansum"), kinds={"aggregation_axis": WARNING}, order=1)
def weights_sum(call: CallView) -> Iterator[Violation]:
    """(weights * values).sum(dim): the sum adds part of the positions a softmax normalised
    jointly, and the rest survive folded into an axis with other positions."""
    x = first_tensor(call)
    meta = call.meta(x) if x is not None else None
    if meta is None or not meta.weighted or not meta.normed_over:
        return
    dims = call.bound().get("dim")
    dims = [dims] if isinstance(dims, int) else dims
    if not isinstance(dims, list | tuple) or not dims:
        return  # a sum of everything adds the whole extent
    ndim = x.dim()
    if not all(isinstance(d, int) and -ndim <= d < ndim for d in dims):
        return
    summed = {d % ndim for d in dims}
    pieces = meta.normed_over
    added = [p for p in pieces if p[0] in summed]
    kept = [p for p in pieces if p[0] not in summed]
    # A kept factor that is an axis of its own may be summed next; one folded with other
    # positions (`[batch * heads]`) would need a view to unfold it first.
    if not added or not kept or any(hi // lo == x.shape[axis] for axis, lo, hi in kept):
        return
    names = call.axes(x)
    size = added_size = 1
    for axis, lo, hi in pieces:
        size *= hi // lo
        added_size *= hi // lo if axis in summed else 1
    d = sorted(summed)[0] - ndim if len(summed) == 1 else tuple(sorted(s - ndim for s in summed))
    survivors = ", ".join(_piece_text(meta, names, x, p) for p in kept)
    label = call.label(0, "input")
    yield Violation(
        "aggregation_axis",
        f"sum over dim {d} adds {added_size} of the {size} weights one softmax normalised "
        f"jointly, and leaves {survivors} unsummed: each output's weights do not sum to 1",
        (call.operand(label, x),),
        f"take the softmax over only the {added_size} weights this sum adds (view them so "
        f"that the other factor is an axis of its own, then softmax along the {added_size}), "
        f"or sum over all {size}",
        severity="warning",
    )


def _piece_text(meta, names, x, piece) -> str:
    """A factor the sum left: its name where its dim names it, and the axis it sits in."""
    axis, lo, hi = piece
    inner = 1
    name = None
    for atom in reversed(D.normalize(meta.dims[axis])):
        if inner == lo and inner * atom[2] == hi:
            name = D.atom_name(atom)
        inner *= atom[2]
    shown = f"{names[axis]}={x.shape[axis]}" if names and names[axis] else f"size {x.shape[axis]}"
    factor = f"the factor {name}={hi // lo}" if name else f"a factor of size {hi // lo}"
    return f"{factor} of dim {axis - x.dim()} ({shown})"
