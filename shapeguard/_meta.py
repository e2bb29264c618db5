"""What a trace knows about a live tensor: its label, role and axis names.

Kept in a weak-keyed table, so the trace never keeps a tensor alive, and
propagated from each op's inputs to its outputs (data flow).
"""

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


# Ops after which a tensor keeps its names and role as they were.
SHAPE_PRESERVING = frozenset(
    {
        "contiguous", "clone", "detach", "float", "half", "bfloat16", "double", "to", "type_as",
        "dropout", "dropout_", "div", "div_", "mul", "mul_", "add", "add_", "sub", "sub_",
        "masked_fill", "masked_fill_", "softmax", "log_softmax", "relu", "gelu", "silu",
        "tanh", "sigmoid", "exp", "neg", "abs", "sqrt", "rsqrt", "pow", "__truediv__",
        "__mul__", "__add__", "__sub__", "where", "layer_norm", "rms_norm", "requires_grad_",
        "scaled_dot_product_attention",
    }
)

# Data flow: (op, role of the first operand, role of the second) -> role of the result.
_FLOW_ROLES = {
    ("matmul", "Q", "K"): "scores",
    ("matmul", "attn", "V"): "context",
    ("softmax", "scores", None): "attn",
    ("softmax", None, None): "attn",
    ("scaled_dot_product_attention", "Q", "K"): "context",
}


def flow_role(op: str, roles: tuple[str | None, ...]) -> str | None:
    first = roles[0] if roles else None
    second = roles[1] if len(roles) > 1 else None
    for key in ((op, first, second), (op, first, None), (op, None, None)):
        if key in _FLOW_ROLES:
            return _FLOW_ROLES[key]
    if op in SHAPE_PRESERVING or op in ("transpose", "permute", "view", "reshape", "T", "mT"):
        return first
    return None


def output_axes(
    op: str,
    args: tuple,
    kwargs: dict,
    in_shapes: list[tuple[int, ...] | None],
    in_axes: list[Axes],
    out_shape: tuple[int, ...],
    vocab: _axes.Vocabulary,
) -> Axes:
    """Axis names for the first output of `op`, from its inputs where the op says how."""
    first_shape = in_shapes[0] if in_shapes else None
    first_axes = in_axes[0] if in_axes else ()
    guessed = vocab.guess(out_shape)
    if first_shape is None or not first_axes:
        return guessed
    result: Axes | None = None
    if op in ("transpose", "swapaxes", "swapdims") and len(args) >= 3:
        result = _axes.transpose(first_axes, int(args[1]), int(args[2]))
    elif op in ("mT", "T") and len(first_axes) >= 2:
        result = _axes.transpose(first_axes, -2, -1) if op == "mT" else tuple(reversed(first_axes))
    elif op == "permute":
        order = args[1:] if len(args) > 2 or not isinstance(args[1], tuple | list) else args[1]
        if len(order) == len(first_axes):
            result = _axes.permute(first_axes, [int(i) % len(first_axes) for i in order])
    elif op in ("view", "reshape", "flatten", "unflatten"):
        result = _axes.view_axes(first_shape, first_axes, out_shape, vocab)
    elif op in ("matmul", "bmm", "__matmul__") and len(in_shapes) >= 2 and in_shapes[1]:
        result = _axes.matmul_axes(first_shape, first_axes, in_shapes[1], in_axes[1])
    elif op == "linear":
        result = (*first_axes[:-1], vocab.name_of(out_shape[-1]))
    elif tuple(first_shape) == tuple(out_shape):
        result = first_axes
    else:
        for shape, axes in zip(in_shapes, in_axes, strict=False):
            if shape is not None and tuple(shape) == tuple(out_shape) and axes:
                result = axes
                break
    if result is None or len(result) != len(out_shape):
        return guessed
    # Fill what propagation could not name from the vocabulary.
    return tuple(name or guess for name, guess in zip(result, guessed, strict=True))


def role_for(label: str | None, op: str, in_roles: tuple[str | None, ...]) -> str | None:
    """Name first, data flow as the fallback."""
    return canonical_role(label) or flow_role(op, in_roles)
