"""view / reshape: element count (which axis cannot split, into what), head
divisibility at the head split, and `view` of a tensor that transpose left
non-contiguous."""

from collections.abc import Iterator
from math import prod

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from .._values import is_tensor
from . import ERROR, rule
from ._accounts import count_account
from ._view import CallView
from ._view_shape import target_shape, view_compatible
from .config import divisibility_violation
from .regroup import noncontiguous_hint


@rule(
    _ops.by_name("view"),
    _ops.by_name("reshape"),
    kinds={
        "view_numel": ERROR,
        "noncontiguous_view": ERROR,
        "head_divisibility": ERROR,
        # The account tensor parallelism registers of a wrong element count (`_accounts`).
        "tp_global_heads": ERROR,
        "tp_local_heads": ERROR,
    },
)
def view(call: CallView) -> Iterator[Violation]:
    """view / reshape: the element count, and the strides view needs (what the regrouping
    does to the axes is the regroup family's)."""
    args = call.args
    if not args or not is_tensor(args[0]):
        return
    x = args[0]
    target = target_shape(args, call.kwargs)
    if target is None:
        return
    shape = tuple(int(s) for s in x.shape)
    numel = prod(shape)
    label = call.label(0, "input")
    spelled = ", ".join(str(s) for s in target)
    expr = f"{label}.{call.op}({spelled})"
    resolved = _axes.resolve_view_shape(numel, target)
    if resolved is None:
        yield count_account(call, x, target, expr, label) or _numel_violation(
            call, x, label, expr, shape, target
        )
        return
    if (
        call.op == "view"
        and not x.is_contiguous()
        and not view_compatible(shape, tuple(x.stride()), resolved)
    ):
        yield _noncontiguous_violation(call, x, label, expr, shape, target, resolved)
        return


def _numel_violation(call, x, label: str, expr: str, shape, target) -> Violation:
    numel = prod(shape)
    axes = call.axes(x)
    operands = (call.operand(label, x),)
    declared = call.declared()
    if "d_model" in declared and "heads" in declared:
        d_attr, d_model = declared["d_model"]
        h_attr, heads = declared["heads"]
        if d_model % heads and heads in target and d_model in shape:
            base = divisibility_violation(d_attr, d_model, h_attr, heads)
            return Violation(
                "head_divisibility",
                f"{expr}: cannot split {d_attr}={d_model} into {h_attr}={heads} heads: {base.relation}",
                operands,
                base.hint,
            )
    # Strip the axes that stay as they are, to name the part that cannot be regrouped.
    lo = 0
    while lo < min(len(shape), len(target)) and shape[lo] == target[lo]:
        lo += 1
    hi_s, hi_t = len(shape), len(target)
    while hi_s > lo and hi_t > lo and shape[hi_s - 1] == target[hi_t - 1]:
        hi_s -= 1
        hi_t -= 1
    src_part = [
        f"{axes[i]}={shape[i]}" if axes and axes[i] else str(shape[i]) for i in range(lo, hi_s)
    ]
    dst_part = [str(s) for s in target[lo:hi_t]]
    known = prod(s for s in target if s != -1)
    if -1 in target:
        why = f"the other sizes multiply to {known}, which does not divide {numel}"
    else:
        why = f"{' * '.join(map(str, target))} = {prod(target)} elements, not {numel}"
    relation = (
        f"{expr}: {label} has {numel} elements; cannot regroup "
        f"[{', '.join(src_part) or '-'}] as [{', '.join(dst_part) or '-'}] ({why})"
    )
    hint = "the sizes must multiply to the same count; check the head count and head size"
    if -1 in target and len(target) >= 2:
        hint = (
            f"with -1 inferred, the remaining sizes must divide {numel}; "
            "torch would say: shape '["
            + ", ".join(map(str, target))
            + f"]' is invalid for input of size {numel}"
        )
    return Violation("view_numel", relation, operands, hint)


def _noncontiguous_violation(call, x, label: str, expr: str, shape, target, resolved) -> Violation:
    axes = call.axes(x)
    meta = call.meta(x)
    made_by = f" (it comes from {meta.op})" if meta is not None and meta.op else ""
    merged: list[str] = []
    groups = _axes.view_groups(shape, resolved) or []
    for src, dst in groups:
        real = [i for i in src if shape[i] != 1]
        if len(real) > 1 and len(dst) >= 1:
            merged = [f"{axes[i]}" if axes and axes[i] else f"dim {i}" for i in real]
            break
    what = f" and view cannot merge {' and '.join(merged)}" if merged else ""
    # The regroup family knows whether the view moves data across axes, where .reshape
    # would run and be wrong (heads carved out of the sequence of a split's column slice).
    return Violation(
        "noncontiguous_view",
        f"{expr}: {label} is not contiguous{made_by}{what}",
        (call.operand(label, x),),
        noncontiguous_hint(call, x, target, shape, resolved, label),
    )
