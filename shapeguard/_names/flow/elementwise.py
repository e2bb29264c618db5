"""Shape-preserving ops, elementwise ops with broadcasting, reductions."""

from ... import _ops
from ..._values import is_tensor
from .. import dims as D
from ..dims import Axis
from .base import (
    Made,
    fallback_axes,
    first_tensor,
    propagates,
    tag_at,
    tags_if_any,
)
from .waiting import carry


# -- shape-preserving -----------------------------------------------------------------------------
@propagates(_ops.SAME)
def _same(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    spec = call.spec
    role = m.role if spec.keeps_label else None
    if spec is _SOFTMAX or spec is _LOG_SOFTMAX:
        role = "attn" if m.role == "scores" else None
    out = []
    laid_out = m.laid_out and spec.keeps_value  # a copy keeps the chosen order
    for o in outputs:
        if tuple(o.shape) != tuple(x.shape):
            return None
        out.append(Made(m.dims, m.tags, role, spec.rotary or m.rotary, m.param, laid_out))
    carry(call, outputs)
    return out


# Softmaxes turn scores into attention weights (log_softmax: their logarithm).
_SOFTMAX, _LOG_SOFTMAX = _ops.by_name("softmax"), _ops.by_name("log_softmax")
_ATTENTION_OWN = frozenset({"scores", "attn", "mask"})


def _tagged(m) -> bool:
    return any(tag is not None for tag in m.tags)


# -- elementwise with broadcasting --------------------------------------------------------------
@propagates(_ops.BINARY)
def _binary(call, outputs):
    tensors = call.tensors()
    if not tensors:
        return None
    out = outputs[0]
    out_shape = tuple(out.shape)
    ndim = len(out_shape)
    metas = [call.meta_of(t) for t in tensors]
    # Each shape read once (`t.shape` builds a torch.Size per read).
    shapes = [tuple(t.shape) for t in tensors]
    axes: list[Axis] = []
    tags: list[str | None] = []
    for pos in range(ndim):
        chosen: Axis = ()
        tag = None
        for shape, m in zip(shapes, metas, strict=True):
            k = pos - (ndim - len(shape))
            if k < 0 or shape[k] == 1:
                continue
            axis = m.dims[k]
            if not chosen:
                chosen, tag = axis, tag_at(m, k)
            else:
                D.line_up(chosen, axis)
                tag = tag or tag_at(m, k)
        axes.append(chosen)
        tags.append(tag)
    # The operand the result stands for: the first input of the result's shape, else the first
    # (torch.where's result is its values, never its condition).
    main_meta = next(
        (
            m
            for t, sh, m in zip(tensors, shapes, metas, strict=True)
            if sh == out_shape and not (call.spec is _WHERE and t is _condition(call))
        ),
        metas[0],
    )
    role = main_meta.role if call.spec.keeps_label or call.spec.makes_mask else None
    # Attention's output (or its projection) added back onto the stream, x + context, leaves
    # attention: the sum is neither context nor tagged by query or key positions. The scores
    # plus a mask or bias stay attention's own.
    full = [m for sh, m in zip(shapes, metas, strict=True) if sh == out_shape]
    if (
        len(full) >= 2
        and any(_tagged(m) for m in full)
        and any(m.role is None and not _tagged(m) for m in full)
        and not any(m.role in _ATTENTION_OWN for m in full)
    ):
        role, tags = None, [None] * len(tags)
    # A rotary table scaled by a number is still one; q * cos is not.
    big = [m for t, m in zip(tensors, metas, strict=True) if t.numel() > 1]
    rotary = bool(big) and all(m.rotary for m in big)
    made = Made(tuple(axes), tags_if_any(tags), role, rotary)
    carry(call, outputs)
    return [made for _ in outputs]


_WHERE = _ops.by_name("where")


def _condition(call):
    """torch.where's condition, called as a function or as a method (`x.where(cond, y)`)."""
    return _ops.bind(_WHERE, call.args, call.kwargs, call.is_method).get("condition")


# -- reductions -------------------------------------------------------------------------------------
@propagates(_ops.REDUCE)
def _reduce(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    args = call.args
    if len(args) > 1 and is_tensor(args[1]):  # torch.max(a, b): elementwise
        return _binary(call, outputs)
    m = call.meta_of(x)
    bound = _ops.bind(call.spec, args, call.kwargs)
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    ndim = x.dim()
    if dim is None or isinstance(dim, bool):
        drop = set(range(ndim))
    else:
        dims = dim if isinstance(dim, tuple | list) else (dim,)
        if not all(isinstance(d, int) for d in dims):
            return None
        drop = {d % ndim for d in dims} if ndim else set()
    if keepdim:
        axes = tuple(() if i in drop else a for i, a in enumerate(m.dims))
        tags = tuple(None if i in drop else tag_at(m, i) for i in range(ndim)) if m.tags else ()
    else:
        axes = tuple(a for i, a in enumerate(m.dims) if i not in drop)
        tags = tuple(tag_at(m, i) for i in range(ndim) if i not in drop) if m.tags else ()
    made = Made(axes, tags)
    return [
        made if tuple(o.shape) == tuple(D.size_of(a) for a in axes) else fallback_axes(call, o)
        for o in outputs
    ]
