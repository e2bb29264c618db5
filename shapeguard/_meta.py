"""What a trace knows about a live tensor: its label, role, axis names and origin.

Kept in a weak-keyed table, so the trace never keeps a tensor alive, and
propagated from each op's inputs to its outputs (data flow). Axis names follow
the data: a transpose swaps them, a view that splits d_model names heads and
d_k, a slice keeps them, a concatenation keeps the axes it does not join.
"""

from collections.abc import Callable
from dataclasses import dataclass

from . import _axes
from ._axes import Axes
from ._roles import canonical_role


@dataclass(slots=True)
class TensorMeta:
    label: str | None = None
    role: str | None = None
    axes: Axes = ()
    op: str = ""  # the op that made it, e.g. "transpose"
    transposed: bool = False  # last two axes swapped from a non-contiguous source
    # A module buffer this tensor was read from ("bias"), and whether a slice of it was
    # taken on the way: a causal buffer used whole only fits one sequence length.
    buffer: str = ""
    sliced: bool = False


# Ops after which a tensor keeps its names and role as they were.
SHAPE_PRESERVING = frozenset(
    {
        "contiguous",
        "clone",
        "detach",
        "float",
        "half",
        "bfloat16",
        "double",
        "to",
        "type_as",
        "dropout",
        "dropout_",
        "div",
        "div_",
        "mul",
        "mul_",
        "add",
        "add_",
        "sub",
        "sub_",
        "masked_fill",
        "masked_fill_",
        "softmax",
        "log_softmax",
        "relu",
        "gelu",
        "silu",
        "tanh",
        "sigmoid",
        "exp",
        "neg",
        "abs",
        "sqrt",
        "rsqrt",
        "pow",
        "__truediv__",
        "__mul__",
        "__add__",
        "__sub__",
        "where",
        "layer_norm",
        "rms_norm",
        "requires_grad_",
        "scaled_dot_product_attention",
    }
)

# Ops that keep a buffer's values (so a mask made from a buffer is still that buffer).
_VALUE_KEEPING = frozenset(
    {
        "eq",
        "ne",
        "__eq__",
        "__ne__",
        "logical_not",
        "__invert__",
        "bool",
        "to",
        "float",
        "half",
        "bfloat16",
        "double",
        "type_as",
        "contiguous",
        "clone",
        "detach",
        "view",
        "reshape",
        "unsqueeze",
        "squeeze",
        "expand",
        "expand_as",
        "__getitem__",
        "narrow",
        "long",
        "int",
        "__rsub__",
        "sub",
        "__sub__",
        "mul",
        "__mul__",
        "__rmul__",
        "masked_fill",
        "where",
        "__and__",
        "__or__",
        "logical_and",
        "logical_or",
    }
)
_SLICING = frozenset({"__getitem__", "narrow"})

# Data flow: (op, role of the first operand, role of the second) -> role of the result.
_FLOW_ROLES = {
    ("matmul", "Q", "K"): "scores",
    ("matmul", "attn", "V"): "context",
    ("softmax", "scores", None): "attn",
    ("softmax", None, None): "attn",
    ("scaled_dot_product_attention", "Q", "K"): "context",
}

_LAYOUT_OPS = ("transpose", "permute", "view", "reshape", "T", "mT", "unsqueeze", "squeeze")


def flow_role(op: str, roles: tuple[str | None, ...]) -> str | None:
    first = roles[0] if roles else None
    second = roles[1] if len(roles) > 1 else None
    for key in ((op, first, second), (op, first, None), (op, None, None)):
        if key in _FLOW_ROLES:
            return _FLOW_ROLES[key]
    if op in SHAPE_PRESERVING or op in _LAYOUT_OPS:
        return first
    return None


def _arg(args: tuple, kwargs: dict, index: int, name: str, default=None):
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _dim(value, ndim: int) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and ndim:
        return value % ndim
    return None


def output_axes(
    op: str,
    args: tuple,
    kwargs: dict,
    in_shapes: list[tuple[int, ...] | None],
    in_axes: list[Axes],
    out_shape: tuple[int, ...],
    vocab: _axes.Vocabulary,
    declared: Callable[[], dict] | None = None,
) -> Axes:
    """Axis names for an output of `op` (of shape `out_shape`), from its inputs where the
    op says how; `declared` gives the sizes the module declares, when a split needs them."""
    first_shape = in_shapes[0] if in_shapes else None
    first_axes = in_axes[0] if in_axes else ()
    guessed = vocab.guess(out_shape)
    if first_shape is None or not first_axes:
        return guessed
    result = _propagate(op, args, kwargs, in_shapes, in_axes, out_shape, vocab, declared)
    if result is None or len(result) != len(out_shape):
        return guessed
    # Fill what propagation could not name from the vocabulary; "" marks an axis that
    # propagation knows to be unnamed (a broadcast copy), which stays unnamed.
    return tuple(
        (name or None) if name is not None else guess
        for name, guess in zip(result, guessed, strict=True)
    )


def _propagate(op, args, kwargs, in_shapes, in_axes, out_shape, vocab, declared) -> Axes | None:
    first_shape, first_axes = tuple(in_shapes[0]), in_axes[0]
    ndim = len(first_axes)
    if op in ("transpose", "swapaxes", "swapdims"):
        d0, d1 = _arg(args, kwargs, 1, "dim0"), _arg(args, kwargs, 2, "dim1")
        if isinstance(d0, int) and isinstance(d1, int):
            return _axes.transpose(first_axes, d0, d1)
        return None
    if op in ("mT", "T", "t"):
        if op == "mT" or ndim == 2:
            return _axes.transpose(first_axes, -2, -1) if ndim >= 2 else first_axes
        return tuple(reversed(first_axes))
    if op == "permute":
        rest = args[1:]
        order = rest[0] if len(rest) == 1 and isinstance(rest[0], tuple | list) else rest
        order = order or kwargs.get("dims", ())
        if len(order) == ndim:
            return _axes.permute(first_axes, [int(i) % ndim for i in order])
        return None
    if op in ("view", "reshape", "flatten", "unflatten", "view_as", "reshape_as"):
        names = _axes.view_axes(first_shape, first_axes, out_shape, vocab)
        return _name_head_split(first_shape, first_axes, out_shape, names, declared)
    if op in ("matmul", "bmm", "__matmul__") and len(in_shapes) >= 2 and in_shapes[1]:
        return _axes.matmul_axes(first_shape, first_axes, in_shapes[1], in_axes[1])
    if op == "__rmatmul__" and len(in_shapes) >= 2 and in_shapes[1]:
        return _axes.matmul_axes(in_shapes[1], in_axes[1], first_shape, first_axes)
    if op == "linear":
        return (*first_axes[:-1], vocab.name_of(out_shape[-1]))
    if op == "scaled_dot_product_attention" and len(in_axes) >= 3:
        value_axes = in_axes[2]
        if len(value_axes) == ndim:
            return (*first_axes[:-1], value_axes[-1])
        return None
    if op == "unsqueeze":
        dim = _arg(args, kwargs, 1, "dim")
        if isinstance(dim, int):
            dim = dim % (ndim + 1)
            return (*first_axes[:dim], None, *first_axes[dim:])
        return None
    if op == "squeeze":
        return _squeeze(first_shape, first_axes, _arg(args, kwargs, 1, "dim"))
    if op == "__getitem__" and len(args) >= 2:
        return _index_axes(first_shape, first_axes, args[1])
    if op in ("cat", "concat", "concatenate", "stack"):
        return _join_axes(op, args, kwargs, in_shapes, in_axes, out_shape, vocab)
    if op in ("split", "chunk", "unbind", "tensor_split", "split_with_sizes", "narrow"):
        return _part_axes(op, args, kwargs, first_shape, first_axes, out_shape, vocab)
    if op in ("expand", "expand_as", "repeat", "broadcast_to", "repeat_interleave", "tile"):
        return _grow_axes(first_shape, first_axes, out_shape, vocab)
    if op in ("sum", "mean", "amax", "amin", "max", "min", "std", "var", "norm", "all", "any"):
        reduced = _reduce_axes(first_shape, first_axes, out_shape, args, kwargs)
        if reduced is not None:
            return reduced
    if tuple(first_shape) == tuple(out_shape):
        return first_axes
    for shape, axes in zip(in_shapes, in_axes, strict=False):
        if shape is not None and tuple(shape) == tuple(out_shape) and axes:
            return axes
    return None


def _name_head_split(src_shape, src_axes: Axes, dst_shape, names: Axes, declared) -> Axes:
    """A view that splits the feature axis into two parts whose last is the declared head
    size is a head split: name the parts heads (or kv_heads) and d_k, even when their
    sizes coincide with another axis and the vocabulary cannot tell them apart."""
    if declared is None:
        return names
    groups = _axes.view_groups(src_shape, dst_shape) or []
    sizes: dict | None = None
    out = list(names)
    for gi, gj in groups:
        real_i = [i for i in gi if src_shape[i] != 1]
        real_j = [j for j in gj if dst_shape[j] != 1]
        if len(real_i) != 1 or len(real_j) != 2:
            continue
        if src_axes and src_axes[real_i[0]] in ("batch", "seq", "seq_q", "seq_k", "heads"):
            continue
        if sizes is None:
            sizes = {axis: size for axis, (_, size) in declared().items()}
        d_k = sizes.get("d_k")
        a, b = real_j
        if d_k is None or dst_shape[b] != d_k:
            continue
        if dst_shape[a] == sizes.get("heads"):
            out[a], out[b] = "heads", "d_k"
        elif dst_shape[a] == sizes.get("kv_heads"):
            out[a], out[b] = "kv_heads", "d_k"
    return tuple(out)


def _squeeze(shape, axes: Axes, dim) -> Axes:
    ndim = len(axes)
    if dim is None:
        return tuple(a for a, s in zip(axes, shape, strict=True) if s != 1)
    dims = dim if isinstance(dim, tuple | list) else (dim,)
    drop = {d % ndim for d in dims if isinstance(d, int) and shape[d % ndim] == 1}
    return tuple(a for i, a in enumerate(axes) if i not in drop)


def _index_axes(shape, axes: Axes, index) -> Axes | None:
    """Names after basic indexing: an int drops its axis, a slice keeps it (a sliced seq
    is still seq), None inserts an unnamed axis. Advanced indexing is left unnamed."""
    items = index if isinstance(index, tuple) else (index,)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    out: list[str | None] = []
    pos = 0
    for item in items:
        if item is None:
            out.append(None)
        elif item is Ellipsis:
            keep = len(axes) - consumed
            if keep < 0:
                return None
            out.extend(axes[pos : pos + keep])
            pos += keep
        elif isinstance(item, slice):
            if pos >= len(axes):
                return None
            out.append(axes[pos])
            pos += 1
        elif isinstance(item, int) and not isinstance(item, bool):
            pos += 1
        else:
            return None  # tensors, lists, bools: advanced indexing
    out.extend(axes[pos:])
    return tuple(out)


def _join_axes(op, args, kwargs, in_shapes, in_axes, out_shape, vocab) -> Axes | None:
    """cat keeps every axis but the joined one, which keeps a name its parts share; stack
    inserts an unnamed axis."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, tuple | list) or not tensors:
        return None
    count = len(tensors)
    parts = list(zip(in_shapes[:count], in_axes[:count], strict=False))
    if not parts:
        return None
    first_axes = parts[0][1]
    ndim = len(first_axes)
    dim = _arg(args, kwargs, 1, "dim", 0)
    if op == "stack":
        if not isinstance(dim, int):
            return None
        dim = dim % (ndim + 1)
        return (*first_axes[:dim], None, *first_axes[dim:])
    dim = _dim(dim, ndim)
    if dim is None or len(out_shape) != ndim:
        return None
    out = list(first_axes)
    joined = {axes[dim] for _, axes in parts if len(axes) == ndim}
    out[dim] = vocab.name_of(out_shape[dim]) or (joined.pop() if len(joined) == 1 else None)
    return tuple(out)


def _part_axes(op, args, kwargs, shape, axes: Axes, out_shape, vocab) -> Axes | None:
    """split/chunk/narrow keep every axis; the cut one takes the name of its new size
    when the module declares it (a fused qkv split into three d_model parts)."""
    ndim = len(axes)
    if op == "unbind":
        dim = _dim(_arg(args, kwargs, 1, "dim", 0), ndim)
        return None if dim is None else tuple(a for i, a in enumerate(axes) if i != dim)
    default = 0
    index = 1 if op == "narrow" else 2
    dim = _dim(_arg(args, kwargs, index, "dim", default), ndim)
    if dim is None or len(out_shape) != ndim:
        return None
    out = list(axes)
    if out_shape[dim] != shape[dim]:
        out[dim] = vocab.name_of(out_shape[dim]) or axes[dim]
    return tuple(out)


def _grow_axes(shape, axes: Axes, out_shape, vocab) -> Axes | None:
    """expand/repeat/repeat_interleave: aligned from the right, an axis that keeps its
    size keeps its name; one that grows is named by its new size (kv_heads -> heads)."""
    lead = len(out_shape) - len(axes)
    if lead < 0:
        return None
    out: list[str | None] = [vocab.name_of(s) for s in out_shape[:lead]]
    for name, old, new in zip(axes, shape, out_shape[lead:], strict=True):
        out.append(name if old == new else vocab.name_of(new))
    # A size-1 axis grown to a size that names another axis here is a copy of it
    # (repeat_kv's `[:, :, None].expand(..., n_rep, ...)` with n_rep == batch): unnamed.
    for i, (name, new) in enumerate(zip(out, out_shape, strict=True)):
        old = shape[i - lead] if i >= lead else 1
        if name is not None and old != new and name in out[:i] + out[i + 1 :]:
            out[i] = ""
    return tuple(out)


def _reduce_axes(shape, axes: Axes, out_shape, args, kwargs) -> Axes | None:
    dim = _arg(args, kwargs, 1, "dim")
    keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
    if dim is None or isinstance(dim, bool):
        return None
    dims = dim if isinstance(dim, tuple | list) else (dim,)
    if not all(isinstance(d, int) for d in dims):
        return None
    drop = {d % len(axes) for d in dims}
    if keepdim:
        return tuple(None if i in drop else a for i, a in enumerate(axes))
    return tuple(a for i, a in enumerate(axes) if i not in drop)


def role_for(label: str | None, op: str, in_roles: tuple[str | None, ...]) -> str | None:
    """Name first, data flow as the fallback."""
    return canonical_role(label) or flow_role(op, in_roles)


def buffer_origin(op: str, in_tensors: list, in_metas: list, modules: list) -> tuple[str, bool]:
    """(buffer name, sliced) for an op's output: read straight from a module buffer, or
    from a tensor that was, through ops that keep the buffer's values."""
    # Only single-tensor ops: `mask * scores` is no longer the mask.
    if op not in _VALUE_KEEPING or len(in_tensors) != 1:
        return "", False
    tensor, meta = in_tensors[0], in_metas[0]
    if meta is not None:
        return (meta.buffer, meta.sliced or op in _SLICING) if meta.buffer else ("", False)
    name = _buffer_name(tensor, modules)
    return (name, op in _SLICING) if name else ("", False)


def _buffer_name(tensor, modules: list) -> str:
    for module in reversed(modules):
        for name, buf in getattr(module, "_buffers", {}).items():
            if buf is tensor:
                return name
    return ""
