"""How each op family makes the axes of its outputs from the axes of its inputs.

One rule per family of the op table (`_ops.py`), registered with `@propagates`.
A rule returns, per output tensor, a `Made`: its axes (atoms, see `dims`), the
q/k tags of its sequence axes, the role data flow gives it (scores for a
query-key product, attn for their softmax, context for attn @ V) and whether
it is a rotary table. Rules also record what an op tells about its inputs: a
Linear reads its input's last axis as features, attention runs along seq_k,
an embedding's output width is d_model. Sizes name nothing here except where a
module declares them (`declared`), and only for feature axes.
"""

# The axis rules register; `weights`, `extent` and `addresses` are called by `propagate`.
from . import addresses, attention, elementwise, extent, inputs, products, views, weights  # noqa: F401
from .base import Made, fallback_axes, propagates, rule_for
from .products import classify_product
from .views import layout_order, regroup_view

__all__ = ["Made", "classify_product", "layout_order", "propagate", "propagates", "regroup_view"]


def propagate(call, outputs: list) -> list[Made]:
    """The axes of each output of `call` (an `OpCall`)."""
    rule = rule_for(call.spec.family)
    made = rule(call, outputs) if rule is not None else None
    if made is None or len(made) != len(outputs):
        made = [fallback_axes(call, out) for out in outputs]
    fixed = []
    for m, out in zip(made, outputs, strict=True):
        if not _fits(m.dims, out.shape):
            m = fallback_axes(call, out)
        fixed.append(m)
    return addresses.carry(call, extent.carry(call, weights.carry(call, fixed)))


def _fits(dims: tuple, shape) -> bool:
    """Whether the axes' sizes are the shape's (`dims.size_of` of each, inlined: once per
    output of every op)."""
    if len(dims) != len(shape):
        return False
    for axis, size in zip(dims, shape, strict=True):
        total = 1
        for _, _, n in axis:
            total *= n
        if total != int(size):
            return False
    return True
