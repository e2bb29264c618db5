"""Masks and broadcasting: masked_fill, where, and masks added to scores."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from .._names.dims import FEATURE, TOKEN
from .._names.flow import waiting
from .._values import is_tensor
from . import ERROR, WARNING, rule
from ._view import CallView

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass

_MASK_KINDS = {"mask_dtype": ERROR, "mask_broadcast": ERROR}
# + - * / (reflected too: 2 - t arrives as __rsub__), in the table's order.
_ARITHMETIC = tuple(
    op for op in _ops.ALL if op.family == _ops.BINARY and op.symbol in "+-*/" and op.symbol
)


def ref(label: str) -> str:
    """`mask` stays `mask`; `mask == 0` becomes `(mask == 0)`, so `.batch` can follow it."""
    return (
        label
        if label.replace("_", "").replace(".", "").replace("^", "").isalnum()
        else f"({label})"
    )


def _base_name(label: str) -> str:
    """The variable a hint should fix: `mask` in `mask == 0`."""
    for sep in (" == ", " != ", " > ", " < ", " >= ", " <= "):
        if sep in label:
            return label.split(sep, 1)[0].strip("() ")
    return ref(label)


def mask_hint(call, mask, mask_label: str, target_shape: tuple[int, ...]) -> str | None:
    """The usual fix for a mask that does not line up with [batch, heads, seq_q, seq_k]."""
    m = tuple(mask.shape)
    mask_label = _base_name(mask_label)
    if len(target_shape) != 4 or not m:
        return None
    if call.kind(mask, 0, strong=True) in (TOKEN, FEATURE):
        return None  # its first axis is positions or features by structure: not the batch
    b, _, _, sk = target_shape
    if len(m) == 2 and m == (b, sk):
        return (
            f"{mask_label} is a [batch, seq_k] padding mask: use {mask_label}[:, None, None, :] "
            f"(or .unsqueeze(1).unsqueeze(2)) to get [batch, 1, 1, seq_k] = [{b}, 1, 1, {sk}]"
        )
    if len(m) == 3 and m[0] == b and m[-1] == sk:
        return f"{mask_label} is [batch, seq_q, seq_k]: use {mask_label}.unsqueeze(1) to get [batch, 1, seq_q, seq_k]"
    if len(m) == 2 and m[-1] == sk:
        return f"a [seq_q, seq_k] mask broadcasts as is; {mask_label} is {list(m)}: slice it to the sequence, e.g. {mask_label}[:T, :T]"
    return None


def _broadcast_violation(call, kind, relation_prefix, pairs, target=None, mask=None):
    """Check that the (label, tensor) pairs broadcast together (to `target` when given)."""
    shapes = [tuple(t.shape) for _, t in pairs]
    result = _axes.broadcast_shapes(*shapes)
    if result is not None and (target is None or result == target):
        # The operand lines are written only for a violation; their tensors' metas are
        # read here all the same, in the same order (a tensor first seen gets its axes now).
        for _, t in pairs:
            call.meta_of(t)
        return None
    operands = tuple(call.operand(label, t) for label, t in pairs)
    (la, ta), (lb, tb) = pairs[0], pairs[1]
    bad = _axes.first_mismatch(tuple(ta.shape), tuple(tb.shape))
    if bad is not None:
        x, y = ta.shape[bad], tb.shape[bad]
        relation = (
            f"{relation_prefix}: {ref(la)}.{call.axis(ta, bad)} ({x}) and "
            f"{ref(lb)}.{call.axis(tb, bad)} ({y}) do not broadcast"
        )
    else:
        relation = (
            f"{relation_prefix}: {lb} {list(tb.shape)} would grow {la} {list(ta.shape)} "
            f"to {list(result or ())}"
        )
    hint = None
    if mask is not None:
        mask_label, mask_tensor = mask
        hint = mask_hint(call, mask_tensor, mask_label, tuple(pairs[0][1].shape))
    if hint is None:
        hint = "aligned from the right, each pair of sizes must be equal or one of them 1"
    return Violation(kind, relation, operands, hint)


@rule(_ops.by_name("masked_fill"), kinds=_MASK_KINDS)
def masked_fill(call: CallView) -> Iterator[Violation]:
    """masked_fill: a bool mask that broadcasts to the tensor it fills."""
    args = call.args
    if len(args) < 2 or not is_tensor(args[0]) or not is_tensor(args[1]):
        return
    x, mask = args[0], args[1]
    x_label, mask_label = call.label(0, "input"), call.label(1, "mask")
    prefix = f"{x_label}.{call.op}({mask_label}, ...)"
    if str(mask.dtype) != "torch.bool":
        yield Violation(
            "mask_dtype",
            f"{prefix}: {mask_label} is {str(mask.dtype).removeprefix('torch.')}, masked_fill wants bool",
            (call.operand(mask_label, mask),),
            f"pass a bool mask that is True where {x_label} is filled, e.g. "
            f"{x_label}.masked_fill({mask_label} == 0, float('-inf')) when {mask_label} is 1 where "
            "attention is allowed",
        )
        return
    target = tuple(x.shape)
    violation = _broadcast_violation(
        call,
        "mask_broadcast",
        prefix,
        [(x_label, x), (mask_label, mask)],
        target,
        (mask_label, mask),
    )
    if violation is not None:
        yield violation


_WHERE = _ops.by_name("where")


def where_arguments(call) -> dict[str, tuple[object, str]]:
    """torch.where's condition, input and other, each with its label, however it was
    called: `x.where(cond, y)` arrives as `(x, cond, y)` and is `torch.where(cond, x, y)`
    (the op table's binding of the method, `_ops.Op.method_params`)."""
    params = _WHERE.method_params if call.is_method else _WHERE.params
    bound = _ops.bind(_WHERE, call.args, call.kwargs, call.is_method)
    found = {}
    for name in params:
        if name not in bound:
            continue
        index = params.index(name)
        by_position = index < len(call.args) and name not in call.kwargs
        found[name] = (bound[name], call.label(index, name) if by_position else name)
    return found


def where_spelling(call, cond_label: str) -> str:
    """`torch.where(cond, ...)` or `x.where(cond, ...)`, as the user wrote it."""
    if call.is_method:
        x_label = where_arguments(call).get("input", (None, "input"))[1]
        return f"{ref(x_label)}.where({cond_label}, ...)"
    return f"torch.where({cond_label}, ...)"


@rule(_WHERE, kinds=_MASK_KINDS)
def where(call: CallView) -> Iterator[Violation]:
    """torch.where: a bool condition that broadcasts with both values."""
    parts = where_arguments(call)
    if not all(name in parts for name in ("condition", "input", "other")):
        return
    cond, cond_label = parts["condition"]
    if not is_tensor(cond):
        return
    tensors = [(label, v) for v, label in (parts["input"], parts["other"]) if is_tensor(v)]
    if not tensors:
        return
    value_label, value = max(tensors, key=lambda p: p[1].dim())
    prefix = where_spelling(call, cond_label)
    if str(cond.dtype) != "torch.bool":
        yield Violation(
            "mask_dtype",
            f"{prefix}: {cond_label} is {str(cond.dtype).removeprefix('torch.')}, where wants bool",
            (call.operand(cond_label, cond),),
            f"compare it first, e.g. torch.where({cond_label} == 0, ...) or {cond_label}.bool()",
        )
        return
    pairs = [(value_label, value), (cond_label, cond)] + [p for p in tensors if p[1] is not value]
    violation = _broadcast_violation(
        call, "mask_broadcast", prefix, pairs, None, (cond_label, cond)
    )
    if violation is not None:
        yield violation


def _ordered(call) -> tuple:
    """(a, b) as the source spells them (`2 - t` is reflected)."""
    a, b = call.args[0], call.args[1]
    return (b, a) if call.op in call.spec.reflected else (a, b)


def _operands(call):
    """(a, b, label of a, label of b) as the source spells them (`_ordered`)."""
    la, lb = call.label(0, "a"), call.label(1, "b")
    if call.op in call.spec.reflected:
        la, lb = lb, la
    return (*_ordered(call), la, lb)


@rule(*_ARITHMETIC, kinds={"broadcast": ERROR, "mask_broadcast": ERROR}, operands=2)
def arithmetic(call: CallView) -> Iterator[Violation]:
    """+ - * /: the operands broadcast (in place: to the first one's shape)."""
    args = call.args
    if len(args) < 2 or not is_tensor(args[0]) or not is_tensor(args[1]):
        return
    a, b = _ordered(call)
    sa, sb = tuple(a.shape), tuple(b.shape)
    target = sa if _ops.is_inplace(call.op) else None
    result = sa if sa == sb else _axes.broadcast_shapes(sa, sb)
    if result is not None and (target is None or result == target):
        call.meta_of(a)  # as `_broadcast_violation` reads them: a tensor first seen gets
        call.meta_of(b)  # its axes now, in this order
        return  # they broadcast: the names and roles are read only for a violation
    a, b, la, lb = _operands(call)
    symbol = call.spec.symbol or call.op
    roles = (call.role(a, la), call.role(b, lb))
    mask = (lb, b) if roles[1] == "mask" else (la, a) if roles[0] == "mask" else None
    kind = "mask_broadcast" if mask is not None else "broadcast"
    violation = _broadcast_violation(
        call, kind, f"{la} {symbol} {lb}", [(la, a), (lb, b)], target, mask
    )
    if violation is not None:
        yield violation


def wait_for_softmax(call, findings, shape) -> None:
    """Leave `findings`, made on a tensor of `shape` and true only once a softmax reads
    its last axis, to the output of `call` (`_names.flow.waiting`). They live outside what
    a replay of this step would make, so the step must not be replayed: a rule's look-up
    of a tensor the trace never saw (here one made for it) tells the session so (a rule
    that reads a tensor first seen makes its step not worth replaying)."""
    import torch

    waiting.hand(call, findings, shape)
    call.meta(torch.empty(0))


def _scores_by_structure(call, t) -> bool:
    """Attention scores by structure: a query-key product made them (their role, which
    names never give), and it named their last axis the keys."""
    meta = call.meta(t)
    return meta is not None and meta.role == "scores" and meta.tags[-1:] == ("k",)


def _zeros_and_ones(t) -> bool:
    """An integer tensor of 0s and 1s (HF's attention_mask): a 0/1 mask by its values, not
    by its name. Read only from small CPU tensors."""
    import torch

    if t.dtype.is_complex or t.device.type != "cpu" or t.numel() > 1 << 20 or not t.numel():
        return False
    with torch.no_grad():
        return bool(((t == 0) | (t == 1)).all())


@rule(
    *(op for op in _ARITHMETIC if op.symbol in "+-"),
    kinds={"mask_dtype": WARNING},
    order=1,
    operands=2,
)
def bool_mask_added(call: CallView) -> Iterator[Violation]:
    """A 0/1 mask (bool, or integers that are all 0 and 1) added to (or subtracted from)
    attention scores masks nothing. Scores by structure only (a query-key product's
    output): a bool added to anything else is a 0/1 value (a reset gate, a count), unless a
    softmax over the last axis then reads the sum, where the warning waits for it."""
    args = call.args
    if len(args) < 2 or not is_tensor(args[0]) or not is_tensor(args[1]):
        return
    if args[0].is_floating_point() == args[1].is_floating_point():
        return  # no integer or bool tensor meets a float one here
    a, b, la, lb = _operands(call)
    result = _axes.broadcast_shapes(tuple(a.shape), tuple(b.shape))
    if result is None:
        return  # the broadcast error says it
    prefix = f"{la} {call.spec.symbol} {lb}"
    for label, tensor, other_label, other in ((la, a, lb, b), (lb, b, la, a)):
        if not other.is_floating_point() or tensor.is_floating_point():
            continue
        if other.dim() < 2 or tuple(other.shape) != result:
            return  # the mask grows the sum: not scores plus a mask
        if str(tensor.dtype) != "torch.bool" and not _zeros_and_ones(tensor):
            return
        violation = Violation(
            "mask_dtype",
            f"{prefix}: {label} is a {str(tensor.dtype).removeprefix('torch.')} mask added "
            f"to {other_label}: it adds 0/1 and masks nothing",
            (call.operand(label, tensor),),
            f"use masked_fill(~{label}, float('-inf')) for a bool keep-mask, or an additive "
            f"float mask that is 0 where allowed and -inf where hidden",
            severity="warning",
        )
        if _scores_by_structure(call, other):
            yield violation
        else:
            wait_for_softmax(call, (violation,), result)
        return
