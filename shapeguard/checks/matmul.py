"""matmul, @, bmm, mm, baddbmm, linear and einsum: inner and batch dims, in the user's names."""

from collections.abc import Iterator
from math import prod
from typing import TYPE_CHECKING

from .. import _ops, _source
from .._errors import Operand, Violation
from .._memo import Memo
from .._names import axes as _axes
from .._values import is_tensor
from . import ERROR, rule
from ._view import CallView

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass

_MATMUL = _ops.by_name("matmul")  # broadcasts batch axes; bmm and mm do not
_PRODUCT_KINDS = {"matmul_inner": ERROR, "matmul_batch": ERROR, "matmul_rank": ERROR}


@rule(_ops.by_name("matmul"), _ops.by_name("bmm"), _ops.by_name("mm"), kinds=_PRODUCT_KINDS)
def products(call: CallView) -> Iterator[Violation]:
    """matmul, @, bmm, mm: the inner axes meet, the batch axes broadcast."""
    op = call.op
    if len(call.args) >= 2 and is_tensor(call.args[0]) and is_tensor(call.args[1]):
        a, b = call.args[0], call.args[1]
        a_label, b_label = call.label(0, "a"), call.label(1, "b")
        if op in call.spec.reflected:
            a, b, a_label, b_label = b, a, b_label, a_label
        yield from check_product(call, a, b, a_label, b_label, batched=call.spec is _MATMUL)
        if op == "bmm" and (a.dim() != 3 or b.dim() != 3):
            yield Violation(
                "matmul_rank",
                f"bmm wants two 3-D tensors [batch, n, m]; got {a_label} {a.dim()}-D and "
                f"{b_label} {b.dim()}-D",
                (call.operand(a_label, a), call.operand(b_label, b)),
                "use torch.matmul (or @), which broadcasts leading batch axes",
            )


def _out_prefix(call) -> str:
    labels = call.output_labels(1)
    return f"{labels[0]} = " if labels and labels[0] else ""


def check_product(
    call, a, b, a_label: str, b_label: str, *, batched: bool = True, symbol: str = "@"
):
    """Inner dim of `a @ b`, then its batch axes."""
    if a.dim() == 0 or b.dim() == 0:
        return
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    a_inner = a_shape[-1]
    b_inner_dim = -2 if b.dim() >= 2 else -1
    b_inner = b_shape[b_inner_dim]
    prefix = f"{_out_prefix(call)}{a_label} {symbol} {b_label}"
    operands = (call.operand(a_label, a), call.operand(b_label, b))
    if a_inner != b_inner:
        a_axis = call.axis(a, -1)
        b_axis = call.axis(b, b_inner_dim)
        yield Violation(
            "matmul_inner",
            f"{prefix}: {a_label}.{a_axis} ({a_inner}) != {b_label}.{b_axis} ({b_inner})",
            operands,
            _inner_hint(call, a, b, a_label, b_label),
        )
        return
    if not batched or a.dim() < 3 or b.dim() < 3:
        if not batched and a.dim() == 3 and b.dim() == 3 and a_shape[0] != b_shape[0]:
            yield Violation(
                "matmul_batch",
                f"{prefix}: {a_label}.{call.axis(a, 0)} ({a_shape[0]}) != "
                f"{b_label}.{call.axis(b, 0)} ({b_shape[0]})",
                operands,
                "bmm does not broadcast its batch axis; both tensors need the same batch size",
            )
        return
    a_batch, b_batch = a_shape[:-2], b_shape[:-2]
    bad = _axes.first_mismatch(a_batch, b_batch)
    if bad is None:
        return
    a_dim = a.dim() - 2 + bad
    b_dim = b.dim() - 2 + bad
    a_axis, b_axis = call.axis(a, a_dim), call.axis(b, b_dim)
    x, y = a_shape[a_dim], b_shape[b_dim]
    hint = f"the batch axes ({a_axis}, {b_axis}) must match or be 1 to broadcast"
    if "heads" in (a_axis, b_axis) or "kv_heads" in (a_axis, b_axis):
        big, small = max(x, y), min(x, y)
        if big % small == 0:
            hint = (
                f"{a_label} has {x} heads and {b_label} has {y}: for grouped-query attention "
                f"repeat the kv heads first, e.g. k.repeat_interleave({big // small}, dim=1)"
            )
    yield Violation(
        "matmul_batch",
        f"{prefix}: {a_label}.{a_axis} ({x}) != {b_label}.{b_axis} ({y}) and neither is 1",
        operands,
        hint,
    )


def _inner_hint(call, a, b, a_label: str, b_label: str) -> str:
    a_shape, b_shape = tuple(a.shape), tuple(b.shape)
    base = b_label.removesuffix("^T")
    if call.role(a, a_label) == "attn" and call.role(b, b_label) == "V" and b.dim() >= 2:
        return (
            f"{a_label} weighs {a_shape[-1]} keys but {b_label} has {b_shape[-2]} values: K and V "
            "must have the same sequence length; look at the view or projection that made K "
            "(an earlier shapeguard warning may name it)"
        )
    if b.dim() >= 2 and a_shape[-1] == b_shape[-1]:
        if b_label.endswith("^T"):
            return f"{b_label} is already [..., {call.axis(b, -2)}, {call.axis(b, -1)}]; drop the transpose"
        what = (
            f"{base} was not transposed"
            if call.role(b, b_label) == "K"
            else (f"{b_label}'s last axis matches {a_label}'s")
        )
        return f"{what}: use {a_label} @ {base}.transpose(-2, -1)"
    if a.dim() >= 2 and b.dim() >= 2 and a_shape[-2] == b_shape[-2]:
        return f"did you mean {a_label}.transpose(-2, -1) @ {b_label}?"
    declared = call.declared()
    d_k = declared.get("d_k")
    if d_k is not None:
        attr, size = d_k
        for label, value in (
            (a_label, a_shape[-1]),
            (b_label, b_shape[-2] if b.dim() >= 2 else b_shape[-1]),
        ):
            if value != size:
                return (
                    f"{label} has {value} on the shared axis but the module declares "
                    f"{attr}={size}: check the projection or view that made {label}"
                )
    return "the last axis of the left operand must equal the second-to-last of the right one"


def _linear_label(call) -> tuple[str, str]:
    """(layer label, input label) for F.linear, in the user's names."""
    site = call.site
    module = call.module
    if (
        site is not None
        and site.in_module
        and module is not None
        and type(module).__name__.endswith("Linear")
    ):
        path = call.module_path(module)
        layer = path.rsplit(".", 1)[-1] if path else site.callee or "linear"
        x = _source.short_label(site.args[0]) if site.args and site.callee else "input"
        return layer, x
    return call.label(1, "weight"), call.label(0, "input")


@rule(_ops.by_name("linear"), kinds={"linear_in_features": ERROR})
def linear_width(call: CallView) -> Iterator[Violation]:
    """F.linear (every nn.Linear): the input's last axis is the layer's in_features."""
    args = call.args
    x = args[0] if args else call.kwargs.get("input")
    weight = args[1] if len(args) > 1 else call.kwargs.get("weight")
    if not is_tensor(x) or not is_tensor(weight) or weight.dim() != 2 or x.dim() == 0:
        return
    w_out, w_in = tuple(weight.shape)
    k = x.shape[-1]
    if k == w_in:
        return
    layer, x_label = _linear_label(call)
    axis = call.axis(x, -1)
    axis_text = f"{axis}={k}" if not axis.startswith("dim") else f"{k} features"
    rows = prod(x.shape[:-1])
    leading = " * ".join(str(s) for s in x.shape[:-1]) or "1"
    hint = (
        f"{x_label} has {k} features, {layer} expects {w_in}: build {layer} as "
        f"nn.Linear({k}, {w_out}), or fix what produced {x_label}. "
        f"torch would say: mat1 and mat2 shapes cannot be multiplied ({rows}x{k} and {w_in}x{w_out}) "
        f"(mat1 rows = {leading}, the leading axes of {x_label} flattened)"
    )
    declared = call.declared()
    if "d_model" in declared and declared["d_model"][1] == w_in:
        hint = f"{layer} is sized for d_model={w_in} but {x_label} has {k}. " + hint
    yield Violation(
        "linear_in_features",
        f"{layer} = Linear(in_features={w_in}) got {x_label} with {axis_text}",
        (
            call.operand(x_label, x),
            Operand(layer, f"Linear(in_features={w_in}, out_features={w_out})"),
        ),
        hint,
    )


@rule(_ops.by_name("baddbmm"), kinds={**_PRODUCT_KINDS, "broadcast": ERROR})
def baddbmm(call: CallView) -> Iterator[Violation]:
    """baddbmm: the product's axes, and the added tensor broadcasts to it."""
    p = call.bound()
    base, b1, b2 = p.get("input"), p.get("batch1"), p.get("batch2")
    if not (is_tensor(base) and is_tensor(b1) and is_tensor(b2)):
        return
    l1 = call.label(1, "batch1") if len(call.args) > 1 else "batch1"
    l2 = call.label(2, "batch2") if len(call.args) > 2 else "batch2"
    found = list(check_product(call, b1, b2, l1, l2, batched=False))
    yield from found
    if found or b1.dim() != 3 or b2.dim() != 3:
        return
    result = (b1.shape[0], b1.shape[1], b2.shape[2])
    if _axes.broadcast_shapes(tuple(base.shape), result) != result:
        label = call.label(0, "input")
        yield Violation(
            "broadcast",
            f"baddbmm: {label} {list(base.shape)} does not broadcast to {l1} @ {l2} = {list(result)}",
            (call.operand(label, base), call.operand(l1, b1), call.operand(l2, b2)),
            f"{label} must broadcast to [batch, n, p] = {list(result)}",
        )


def _parse_einsum(equation: str) -> tuple[list[str], str | None]:
    equation = equation.replace(" ", "")
    if "->" in equation:
        lhs, rhs = equation.split("->", 1)
    else:
        lhs, rhs = equation, None
    return lhs.split(","), rhs


def _letter_sizes(spec: str, shape: tuple[int, ...]) -> dict[str, list[int]] | None:
    """Map each letter of one operand's spec to its axis indices."""
    if "..." in spec:
        head, tail = spec.split("...", 1)
        if len(head) + len(tail) > len(shape):
            return None
        positions = list(range(len(head))) + list(range(len(shape) - len(tail), len(shape)))
        letters = head + tail
    else:
        if len(spec) != len(shape):
            return None
        positions = list(range(len(shape)))
        letters = spec
    found: dict[str, list[int]] = {}
    for letter, pos in zip(letters, positions, strict=True):
        found.setdefault(letter, []).append(pos)
    return found


# (equation, operand shapes) -> `_einsum_mismatch`'s verdict (False: nothing to check): it
# reads the equation and the sizes only, and an einsum in a loop repeats both (bounded: a
# model has a few einsums at a few sizes each).
_VERDICTS = Memo("einsum verdicts", 4096)
_UNSEEN = object()


@rule(_ops.by_name("einsum"), kinds={"einsum_dim": ERROR, "einsum_rank": ERROR})
def einsum_sizes(call: CallView) -> Iterator[Violation]:
    """einsum: every operand has one letter per axis, and each letter one size."""
    args = call.args
    if not args or not isinstance(args[0], str):
        return
    equation = args[0]
    tensors = (
        list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else list(args[1:])
    )
    if not all(is_tensor(t) for t in tensors):
        return
    key = (equation, *[t.shape for t in tensors])
    found = _VERDICTS.get(key, _UNSEEN)
    if found is _UNSEEN:
        specs, _ = _parse_einsum(equation)
        found = _einsum_mismatch(specs, tensors) if len(specs) == len(tensors) else False
        _VERDICTS.put(key, found)
    if found is False:
        return
    if found is None:
        # The operand lines are written only for a violation; their tensors' metas are read
        # here all the same, in the same order (a tensor first seen gets its axes now).
        for t in tensors:
            call.meta_of(t)
        return
    # Names and operands are read only now: most einsums are fine, and reading a label
    # looks at the source line.
    labels = [call.label(i + 1, f"operand {i}") for i in range(len(tensors))]
    operands = tuple(call.operand(lab, t) for lab, t in zip(labels, tensors, strict=True))
    if found[0] == "rank":
        _, i, spec = found
        yield Violation(
            "einsum_rank",
            f"einsum '{equation}': {labels[i]} has {tensors[i].dim()} axes but '{spec}' names "
            f"{len(spec.replace('...', ''))}",
            operands,
            f"give {labels[i]} one letter per axis, or use '...' for leading axes",
        )
        return
    _, letter, first_size, first, first_pos, size, i, pos = found
    yield Violation(
        "einsum_dim",
        f"einsum '{equation}': '{letter}' is {first_size} in {labels[first]} "
        f"(axis {first_pos}) but {size} in {labels[i]} (axis {pos})",
        operands,
        f"every operand must agree on the size of '{letter}'",
    )


def _einsum_mismatch(specs: list[str], tensors: list) -> tuple | None:
    """The first operand whose axes its spec does not name one for one ("rank", operand,
    spec), or the first letter two operands size differently ("dim", letter, first size,
    first operand, its axis, size, operand, axis); None when the sizes agree."""
    seen: dict[str, tuple[int, int, int]] = {}
    for i, (spec, tensor) in enumerate(zip(specs, tensors, strict=True)):
        shape = tuple(tensor.shape)
        letters = _letter_sizes(spec, shape)
        if letters is None:
            return ("rank", i, spec)
        for letter, positions in letters.items():
            for pos in positions:
                size = int(shape[pos])
                if letter in seen:
                    first_size, first, first_pos = seen[letter]
                    if size != first_size and 1 not in (size, first_size):
                        return ("dim", letter, first_size, first, first_pos, size, i, pos)
                else:
                    seen[letter] = (size, i, pos)
    return None
