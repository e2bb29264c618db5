"""Shapes, contracts and bindings as the contract messages write them."""

from .. import _axes
from .spec import Spec, axes_for, eval_symbolic


def tuple_text(shape) -> str:
    """`(2, 3)`: a shape as a tuple of ints."""
    return str(tuple(int(s) for s in shape))


def render_expected(spec: Spec, single: dict, variadic: dict) -> str:
    """The shape a spec asks for, each dim with its bound size: `[batch=2, heads, 11]`."""
    parts = []
    for d in spec.dims:
        mark = "#" if d.broadcastable else ""
        if d.kind == "named":
            parts.append(f"{mark}{d.name}={single[d.name]}" if d.name in single else mark + d.name)
        elif d.kind == "fixed":
            parts.append(f"{mark}{d.size}")
        elif d.kind == "symbolic":
            value = eval_symbolic(d.expr, single)
            parts.append(f"{d.expr}={value}" if value is not None else d.expr)
        elif d.kind == "named_var":
            bound = variadic.get(d.name)
            parts.append(f"*{mark}{d.name}={tuple_text(bound[1])}" if bound else f"*{mark}{d.name}")
        elif d.kind == "anon_var":
            parts.append("...")
        else:
            parts.append("_")
    return "[" + ", ".join(parts) + "]"


def render_actual(spec: Spec, shape: tuple, single: dict) -> str:
    """A tensor's shape with the axis names the spec (or else the bindings) give it."""
    names = axes_for(spec, shape)
    if all(n is None for n in names) or len(names) != len(shape):
        by_size: dict[int, str | None] = {}
        for name, size in single.items():
            by_size[size] = name if by_size.get(size, name) == name else None
        names = tuple(by_size.get(s) if s > 1 else None for s in shape)
    return _axes.format_shape(shape, names)


def render_bindings(single: dict, variadic: dict, sources: dict) -> str:
    """`batch=2 (q dim 0), *b=(2, 3) (x)`: each bound dim and what bound it."""
    parts = [f"{n}={v} ({sources[n]})" if n in sources else f"{n}={v}" for n, v in single.items()]
    for n, (_, shape) in variadic.items():
        src = sources.get("*" + n)
        parts.append(f"*{n}={tuple_text(shape)}" + (f" ({src})" if src else ""))
    return ", ".join(parts)
