"""view / reshape: element count (which axis cannot split, into what), head
divisibility at the head split, and `view` of a tensor that transpose left
non-contiguous."""

from math import prod

from .. import _axes, _ops
from .._errors import Violation
from . import ERROR, WARNING, rule
from .config import divisibility_violation


def _target_shape(args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    raw = args[1:] if len(args) > 1 else (kwargs.get("shape") or kwargs.get("size") or ())
    if len(raw) == 1 and isinstance(raw[0], tuple | list):  # torch.Size is a tuple
        raw = tuple(raw[0])
    if not raw or not all(isinstance(s, int) for s in raw):
        return None  # view(dtype), or symbolic sizes: not a shape we can reason about
    return tuple(int(s) for s in raw)


@rule(
    _ops.by_name("view"),
    _ops.by_name("reshape"),
    kinds={
        "view_numel": ERROR,
        "noncontiguous_view": ERROR,
        "head_divisibility": ERROR,
        "view_mixes_axes": WARNING,
    },
)
def view(call):
    """view / reshape: the element count, the strides view needs, and what the regrouping
    does to the axes (a token axis cut across is data moved between tokens)."""
    args = call.args
    if not args or not hasattr(args[0], "shape"):
        return
    x = args[0]
    target = _target_shape(args, call.kwargs)
    if target is None:
        return
    shape = tuple(int(s) for s in x.shape)
    numel = prod(shape)
    label = call.label(0, "input")
    spelled = ", ".join(str(s) for s in target)
    expr = f"{label}.{call.op}({spelled})"
    resolved = _axes.resolve_view_shape(numel, target)
    if resolved is None:
        yield _numel_violation(call, x, label, expr, shape, target)
        return
    if (
        call.op == "view"
        and not x.is_contiguous()
        and not view_compatible(shape, tuple(x.stride()), resolved)
    ):
        yield _noncontiguous_violation(call, x, label, expr, shape, resolved)
        return
    mixing = _mixing_violation(call, x, label, expr, shape, resolved)
    if mixing is not None:
        yield mixing


# Axes whose elements are separate tokens or examples: regrouping them with
# another axis moves data between tokens.
_TOKEN_AXES = ("batch", "seq", "seq_q", "seq_k")
_SEQ_AXES = ("seq", "seq_q", "seq_k")


def _mixing_violation(call, x, label: str, expr: str, shape, resolved) -> Violation | None:
    """A view whose target axes cut across a token axis (batch or seq): legal, and almost
    always a head split or merge done in the wrong order, or a reshape used as a transpose.

    Splitting a token axis, or merging it whole with its neighbors (`[B, S, E] ->
    [B * S, E]`, or `[S, B, E] -> [S, B * H, d_k]`) keeps each token's data together
    and is not reported; only a target axis that straddles a token axis's boundary is.
    """
    axes = call.axes(x)
    if not axes:
        return None
    for gi, gj in _axes.view_groups(shape, resolved) or []:
        real_i = [i for i in gi if shape[i] != 1]
        real_j = [j for j in gj if resolved[j] != 1]
        if len(real_i) < 2 or len(real_j) < 2:
            continue
        for t in real_i:
            if axes[t] in _TOKEN_AXES and _straddles(shape, real_i, t, resolved, real_j):
                return _mixing(call, x, label, expr, shape, resolved, axes, real_i, real_j, t)
    return None


def _straddles(shape, real_i: list[int], t: int, target, real_j: list[int]) -> bool:
    """Whether some target axis covers part of source axis `t` and part of another.

    In the flat memory of one view group, axis `t` spans the strides [inner, outer);
    a target axis is fine when it lies inside that span, outside it, or contains it
    whole, with the boundaries dividing evenly."""
    inner = prod(shape[i] for i in real_i if i > t)
    outer = inner * shape[t]
    for j in real_j:
        lo = prod(target[k] for k in real_j if k > j)
        hi = lo * target[j]
        inside = lo >= inner and hi <= outer and lo % inner == 0 and outer % hi == 0
        outside = (hi <= inner and inner % hi == 0) or (lo >= outer and lo % outer == 0)
        contains = lo <= inner and hi >= outer and inner % lo == 0 and hi % outer == 0
        if not (inside or outside or contains):
            return True
    return False


def _mixing(call, x, label, expr, shape, resolved, axes, real_i, real_j, t) -> Violation:
    names = [axes[i] or f"dim {i}" for i in real_i]
    src = ", ".join(f"{n}={shape[i]}" for n, i in zip(names, real_i, strict=True))
    dst = ", ".join(str(resolved[j]) for j in real_j)
    token = axes[t]
    declared = call.declared()
    regroup = f"regroups [{src}] as [{dst}]"
    if token in _SEQ_AXES and "heads" in names[: real_i.index(t)]:
        relation = (
            f"{expr}: merges heads back before moving them next to d_k: {regroup}, "
            "so each output token holds pieces of other tokens"
        )
        hint = (
            f"transpose first: {label}.transpose(1, 2).contiguous().view(batch, seq, heads * d_k)"
            f"{_sizes_merge(shape, axes)}"
        )
    elif token in _SEQ_AXES and _carves_heads(names, real_i, t, resolved, real_j, declared):
        relation = f"{expr}: carves heads out of the {token} axis: {regroup}"
        hint = _carve_hint(label, shape, real_i, declared)
    elif token == "batch" and any(n in _SEQ_AXES for n in names):
        relation = (
            f"{expr}: folds batch into {_other_token(names)}: {regroup}, "
            "moving data across the batch axis"
        )
        hint = (
            f"reshape reinterprets memory and does not swap axes; to exchange batch and "
            f"{_other_token(names)} use {label}.transpose({real_i[0]}, {real_i[1]})"
        )
    else:
        relation = f"{expr}: {regroup}, moving data across the {token} axis"
        hint = _carve_hint(label, shape, real_i, declared)
    operands = (call.operand(label, x),)
    return Violation("view_mixes_axes", relation, operands, hint, severity="warning")


def _other_token(names: list[str]) -> str:
    return next(n for n in names if n in _SEQ_AXES)


def _carves_heads(names, real_i, t, resolved, real_j, declared) -> bool:
    """The token axis comes first and the target group leads with a head count."""
    heads = declared.get("heads") or declared.get("kv_heads")
    if real_i.index(t) != 0 or len(real_j) < 3:
        return False
    return heads is None or resolved[real_j[0]] in (
        declared.get("heads", ("", 0))[1],
        declared.get("kv_heads", ("", 0))[1],
    )


def _sizes_merge(shape, axes) -> str:
    if len(shape) != 4:
        return ""
    b, h, s, d = shape
    return f", i.e. .transpose(1, 2).reshape({b}, {s}, {h * d})"


def _carve_hint(call_label: str, shape, real_i: list[int], declared) -> str:
    label = call_label
    heads = declared.get("heads")
    d_k = declared.get("d_k")
    features = shape[real_i[-1]]
    if heads is not None and d_k is not None and features != heads[1] * d_k[1]:
        # `W_k(x)` was made by the layer W_k: name the layer to fix.
        made = label.endswith(")") and "(" in label
        maker = label.split("(", 1)[0] if made else f"what made {label}"
        return (
            f"{label} has {features} features but {heads[0]} * {d_k[0]} = {heads[1] * d_k[1]}: "
            f"the -1 absorbed the difference into the sequence axis; check {maker}"
        )
    sizes = ""
    if heads is not None and d_k is not None and len(shape) == 3:
        sizes = f", i.e. view({shape[0]}, {shape[1]}, {heads[1]}, {d_k[1]}).transpose(1, 2)"
    return (
        f"split heads out of the feature axis, then move them: "
        f"use {label}.view(batch, seq, heads, d_k).transpose(1, 2){sizes}"
    )


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


def _noncontiguous_violation(call, x, label: str, expr: str, shape, resolved) -> Violation:
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
    return Violation(
        "noncontiguous_view",
        f"{expr}: {label} is not contiguous{made_by}{what}",
        (call.operand(label, x),),
        f"use {label}.contiguous().view(...) or {label}.reshape(...)",
    )


def view_compatible(
    shape: tuple[int, ...], stride: tuple[int, ...], target: tuple[int, ...]
) -> bool:
    """Whether `view` can give `target` without copying: each run of target axes must
    come from source axes that are laid out one after the other in memory."""
    if prod(shape) == 0 or not shape:
        return True
    view_d = len(target) - 1
    chunk_stride = stride[-1]
    tensor_numel = 1
    view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        chunk_ends = d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_stride)
        if chunk_ends:
            while view_d >= 0 and (view_numel < tensor_numel or target[view_d] == 1):
                view_numel *= target[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return False
            if d > 0:
                chunk_stride = stride[d - 1]
                tensor_numel = 1
                view_numel = 1
    return view_d == -1
