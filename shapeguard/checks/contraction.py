"""A contraction pairs axes of one kind: Q.d_k with K.d_k, attn.seq_k with V.seq.

When seq == d_k, `attn @ V.transpose(-2, -1)`, `torch.matmul(q, k)` (k never
transposed) and einsum subscripts that name the wrong axis all run, and sum
features against positions. The axes' provenance (a projection's features, the
positions attention runs along) tells the two apart whatever their sizes.
"""

from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names import subscripts
from .._names.dims import FEATURE, TOKEN
from .._values import is_tensor
from . import WARNING, rule
from ._einsum import written
from ._view import CallView

_PAIRED = {TOKEN, FEATURE}


def _clash(call, a, a_dim: int, b, b_dim: int) -> tuple[str, str] | None:
    """(a's kind, b's kind) when the two contracted axes are of different kinds, each
    established: from structure or a parameter, or, for a kind the model input's usual
    layout gave, corroborated by identity (the axis is one the other operand keeps: `q @ k`
    contracts k's positions, the very positions q's rows run along, with q's features)."""
    ka, kb = call.kind(a, a_dim), call.kind(b, b_dim)
    if ka == kb or ka not in _PAIRED or kb not in _PAIRED:
        return None
    strong_a = call.kind(a, a_dim, strong=True) is not None
    strong_b = call.kind(b, b_dim, strong=True) is not None
    if not (strong_a or strong_b):
        return None
    if not strong_a and not _kept_by(call, a, a_dim, b, b_dim):
        return None
    if not strong_b and not _kept_by(call, b, b_dim, a, a_dim):
        return None
    return ka, kb


def _kept_by(call, t, dim: int, other, other_dim: int) -> bool:
    """Axis `dim` of `t` is, dim for dim, an axis `other` keeps (not the one it contracts)."""
    roots = D.roots_of(call.dims(t)[dim])
    kept = {
        id(root)
        for i, axis in enumerate(call.dims(other))
        if i != other_dim % other.dim()
        for root in D.roots_of(axis)
    }
    return bool(roots) and all(id(root) in kept for root in roots)


@rule(_ops.by_name("matmul"), _ops.by_name("bmm"), kinds={"contraction_axes": WARNING}, order=1)
def product_axes(call: CallView) -> Iterator[Violation]:
    args = call.args
    if len(args) < 2 or not (is_tensor(args[0]) and is_tensor(args[1])):
        return
    a, b = args[0], args[1]
    reflected = call.op in call.spec.reflected
    if reflected:
        a, b = b, a
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2] or a.shape[-1] < 2:
        return  # a loud mismatch (matmul_inner) or nothing to pair
    clash = _clash(call, a, -1, b, -2)
    if clash is None:
        return
    la, lb = call.label(0, "a"), call.label(1, "b")  # read for a violation only
    if reflected:
        la, lb = lb, la
    base = lb.removesuffix("^T")
    if clash == (TOKEN, FEATURE):
        # a weighs positions (attention weights), b's rows are features: b is transposed.
        made = call.meta(b)
        transposed = made is not None and made.laid_out
        fix = (
            f"use torch.matmul({la}, {base}) ({la} @ {base}), without the transpose: the values "
            f"are already [.., seq_k, d_k]"
            if transposed and base != lb
            else f"lay {lb} out as [.., seq_k, d_k], the positions second to last, so that "
            f"{la} @ {lb} sums over the keys"
        )
    else:
        spelled = (
            f"{la} @ {lb}.transpose(-2, -1)"
            if call.site is not None and call.site.callee == "@"
            else f"torch.matmul({la}, {lb}.transpose(-2, -1))"
        )
        fix = f"{lb} is [.., seq, d_k]: transpose it so the features meet, {spelled}"
    out = call.output_labels(1)
    prefix = f"{out[0]} = " if out and out[0] else ""
    yield Violation(
        "contraction_axes",
        f"{prefix}{la} @ {lb}: contracts {la}.{call.axis(a, -1)} ({a.shape[-1]}) with "
        f"{lb}.{call.axis(b, -2)} ({b.shape[-2]}): a {clash[0]} axis with a {clash[1]} axis, "
        "which runs only because their sizes are equal",
        (call.operand(la, a), call.operand(lb, b)),
        fix,
        severity="warning",
    )


@rule(_ops.by_name("einsum"), kinds={"contraction_axes": WARNING}, order=1)
def einsum_axes(call: CallView) -> Iterator[Violation]:
    """Each contracted letter of a two-operand einsum pairs axes of one kind, whatever
    positions the letters take (`...` included)."""
    args = call.args
    if not args or not isinstance(args[0], str):
        return
    operands = list(args[1:]) if len(args) > 2 else list(args[1]) if len(args) == 2 else []
    if len(operands) != 2 or not all(is_tensor(t) for t in operands):
        return
    product = subscripts.product(args[0], [t.dim() for t in operands])
    if product is None or "->" not in args[0]:
        return
    a, b = operands
    spec_a, spec_b = product.equation.specs
    for letter in product.contracted:
        i, j = spec_a.index(letter), spec_b.index(letter)
        if a.shape[i] != b.shape[j] or a.shape[i] < 2:
            return  # a loud mismatch (einsum_dim)
        clash = _clash(call, a, i, b, j)
        if clash is None:
            continue
        user = written(call, operands)
        la, lb = user.labels
        fixed = _fixed_equation(call, product, b, j, clash[0], user)
        shown = user.words.get(letter, letter) if user.words else letter
        hint = (
            f"give each axis the letter of what it holds: {lb} is "
            f"[{', '.join(n or '?' for n in call.axes(b))}]"
        )
        if fixed is not None:
            hint += f", so write '{fixed}'"
        yield Violation(
            "contraction_axes",
            f"einsum '{user.equation}': '{shown}' contracts {la}.{call.axis(a, i)} ({a.shape[i]}) "
            f"with {lb}.{call.axis(b, j)} ({b.shape[j]}): a {clash[0]} axis with a {clash[1]} "
            "axis, which runs only because their sizes are equal",
            (call.operand(la, a), call.operand(lb, b)),
            hint,
            severity="warning",
        )
        return


def _fixed_equation(call, product, b, j: int, kind: str, user) -> str | None:
    """The equation with b's contracted letter moved onto b's axis of the kind it meets in
    a (swapped with the letter there), when exactly one such axis has an output letter."""
    equation = product.equation
    spec_a, spec = equation.specs
    candidates = [
        p
        for p in range(len(spec))
        if p != j
        and spec[p] in product.cols
        and subscripts.is_letter(spec[p])
        and call.kind(b, p) == kind
    ]
    if len(candidates) != 1:
        return None
    p = candidates[0]
    letters = list(spec)
    letters[j], letters[p] = letters[p], letters[j]
    return user.write(equation, (spec_a, "".join(letters)), equation.out)
