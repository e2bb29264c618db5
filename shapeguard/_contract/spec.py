"""One jaxtyping array type, read once: its dims, dtypes and text, and the axes it names."""

import types
import typing
from dataclasses import dataclass

import jaxtyping

from .._memo import Memo


@dataclass(frozen=True, slots=True)
class _Dim:
    """One dim of a shape string, by kind."""

    kind: str  # "named", "fixed", "symbolic", "anon", "named_var", "anon_var"
    name: str = ""
    size: int = 0
    expr: str = ""
    broadcastable: bool = False


@dataclass(frozen=True, slots=True)
class Spec:
    """The parts of one jaxtyping array type that checks and messages need."""

    dims: tuple[_Dim, ...]
    variadic: int | None  # index of the `*name` / `...` dim
    dtypes: tuple[str, ...] | None  # None: any dtype
    dtype_label: str  # "Float", "Bool"
    array_label: str  # "Tensor"
    dim_str: str

    @property
    def text(self) -> str:
        return f'{self.dtype_label}[{self.array_label}, "{self.dim_str}"]'


# By jaxtyping array type, one per annotation the user writes: bounded all the same.
_spec_cache = Memo("contract specs", 4096)


def _is_array_type(hint) -> bool:
    return isinstance(hint, type) and issubclass(hint, jaxtyping.AbstractArray)


def spec_of(array_type) -> Spec:
    """The `Spec` of a jaxtyping array type, read on first use."""
    spec = _spec_cache.get(array_type)
    if spec is None:
        spec = _spec_cache.put(array_type, _read_spec(array_type))
    return spec


def _read_spec(array_type) -> Spec:
    index_variadic = array_type.index_variadic
    dims = []
    for i, d in enumerate(array_type.dims):
        broadcastable = bool(getattr(d, "broadcastable", False))
        if hasattr(d, "size"):
            dims.append(_Dim("fixed", size=d.size, broadcastable=broadcastable))
        elif hasattr(d, "elem"):
            dims.append(_Dim("symbolic", expr=str(d.elem), broadcastable=broadcastable))
        elif hasattr(d, "name"):
            kind = "named_var" if i == index_variadic else "named"
            dims.append(_Dim(kind, name=d.name, broadcastable=broadcastable))
        else:
            dims.append(_Dim("anon_var" if i == index_variadic else "anon"))
    dtypes = array_type.dtypes
    dtypes = tuple(dtypes) if isinstance(dtypes, list | tuple) else None
    dtype = getattr(array_type, "dtype", None)
    array = array_type.array_type
    return Spec(
        dims=tuple(dims),
        variadic=index_variadic,
        dtypes=dtypes,
        dtype_label=getattr(dtype, "__name__", "Shaped"),
        array_label=getattr(array, "__name__", repr(array)),
        dim_str=array_type.dim_str,
    )


def array_types(hint) -> list:
    """The jaxtyping array types inside a hint (through unions, Optional, tuples, lists)."""
    if _is_array_type(hint):
        return [hint]
    found = []
    for arg in typing.get_args(hint):
        found.extend(array_types(arg))
    return found


def hint_text(hint) -> str:
    """An annotation as the user would write it: `Bool[Tensor, "batch 1 seq seq"] | None`."""
    if hint is type(None) or hint is None:
        return "None"
    if _is_array_type(hint):
        return spec_of(hint).text
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(hint_text(a) for a in typing.get_args(hint))
    if origin is not None:
        args = typing.get_args(hint)
        name = getattr(origin, "__name__", repr(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else hint_text(a) for a in args)}]"
    if isinstance(hint, type):
        return hint.__name__
    return repr(hint)


def eval_symbolic(expr: str, single: dict) -> int | None:
    """The size a symbolic dim (`seq+1`) names with these bindings, or None."""
    try:
        value = eval(expr, {"__builtins__": {"min": min, "max": max, "abs": abs}}, dict(single))  # noqa: S307
    except Exception:
        return None
    return int(value) if isinstance(value, int | float) else None


def names_for(spec: Spec, shape) -> tuple:
    """Axis names of a non-variadic spec for a shape of its rank (None where it names none)."""
    if spec.variadic is not None or len(shape) != len(spec.dims):
        return (None,) * len(shape)
    return tuple(
        d.name if d.kind == "named" and not (d.broadcastable and s == 1) else None
        for d, s in zip(spec.dims, shape, strict=True)
    )


def axes_for(spec: Spec, shape: tuple) -> tuple:
    """Axis names the contract gives a tensor of this shape (None where it names none)."""
    dims, rank = spec.dims, len(shape)
    if spec.variadic is None:
        return names_for(spec, shape)
    i = spec.variadic
    tail = len(dims) - i - 1
    if rank < len(dims) - 1:
        return (None,) * rank
    out: list = [None] * rank
    for k in range(i):
        out[k] = dims[k].name if dims[k].kind == "named" else None
    for t in range(tail):
        d = dims[i + 1 + t]
        out[rank - tail + t] = d.name if d.kind == "named" else None
    return tuple(out)
