"""Inputs for one forward of a model from a file, when the user gives none by hand.

Where they come from, first that applies:

1. `--input name=2,16,512` (dtype prefix allowed: `--input mask=bool:2,1,16,16`): an
   explicit option always wins, for the parameter it names; the others come from below.
2. The file's `example_inputs()`: it may return a tensor, a tuple of positional
   arguments, a dict of keyword arguments, or `(args, kwargs)` (a tuple or list and a
   dict), as `examples/seed_mha.py` does.
3. The forward's jaxtyping annotations (`Float[Tensor, "batch seq d_model"]`): dims named
   after a module attribute (`d_model`, `n_heads`, `head_dim`, ...) take its value,
   `--dim name=size` sets any dim, and the rest get pairwise-distinct sizes, so that a
   swapped axis or a coincidental broadcast cannot hide.
4. The convention `[batch, seq, d_model]` for the first parameter, with d_model read
   from the module (attribute names in `shapeguard._axes.ATTRIBUTE_AXES`), and
   `[batch, seq_k, d_model]` for parameters named like keys or values (`key`, `value`,
   `memory`, `context`).

On `device="meta"` every tensor is made on the meta device: no memory.
"""

import contextlib
import inspect
import typing
from dataclasses import dataclass, field

from . import _axes
from ._loader import LoadError

# First choices for well-known dims; every other dim takes the next free size of _POOL.
_PREFERRED = {
    "batch": 2,
    "b": 2,
    "bs": 2,
    "batch_size": 2,
    "n": 2,
    "seq": 5,
    "seq_q": 5,
    "seq_len": 5,
    "t": 5,
    "l": 5,
    "len_q": 5,
    "tgt_len": 5,
    "q_len": 5,
    "seq_k": 7,
    "seq_kv": 7,
    "s": 7,
    "len_k": 7,
    "src_len": 7,
    "kv_len": 7,
    "kv_seq": 7,
}
_POOL = (2, 5, 7, 3, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71)
_KV_NAMES = frozenset(
    {"key", "value", "k", "v", "memory", "context", "encoder_hidden_states", "kv"}
)


@dataclass(slots=True)
class Inputs:
    """Positional and keyword arguments for one forward, and a line saying where they came from."""

    args: tuple
    kwargs: dict
    how: str
    sizes: dict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InputSpec:
    """`--input name=dtype:2,16,512`, parsed."""

    name: str
    shape: tuple[int, ...]
    dtype: str | None = None


def parse_input_specs(items) -> dict[str, InputSpec]:
    """Parse `--input` options; a LoadError names the bad one and shows the right form."""
    specs: dict[str, InputSpec] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        example = "--input x=2,16,512 or --input mask=bool:2,1,16,16"
        if not sep or not name.isidentifier():
            raise LoadError(f"--input {item!r} is not NAME=SHAPE; write e.g. {example}")
        dtype, colon, sizes = text.rpartition(":")
        dtype = dtype.strip() or None if colon else None
        if dtype is not None:
            _dtype(dtype, item)
        try:
            shape = tuple(int(s) for s in sizes.split(",") if s.strip())
        except ValueError:
            raise LoadError(
                f"--input {item!r}: {sizes!r} is not a list of sizes; write e.g. {example}"
            ) from None
        if not shape or any(s < 0 for s in shape):
            raise LoadError(
                f"--input {item!r}: give the sizes as non-negative integers; write e.g. {example}"
            )
        specs[name] = InputSpec(name, shape, dtype)
    return specs


def parse_dims(items) -> dict[str, int]:
    """Parse `--dim name=size` options."""
    dims: dict[str, int] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        try:
            size = int(text)
        except ValueError:
            size = -1
        if not sep or not name or size < 1:
            raise LoadError(
                f"--dim {item!r} is not NAME=SIZE with a positive size; write e.g. --dim seq=128"
            )
        dims[name] = size
    return dims


def _dtype(name: str, item: str = ""):
    import torch

    aliases = {
        "float": "float32",
        "double": "float64",
        "half": "float16",
        "long": "int64",
        "int": "int64",
    }
    value = getattr(torch, aliases.get(name, name), None)
    if not isinstance(value, torch.dtype):
        raise LoadError(
            f"--input {item!r}: {name!r} is not a torch dtype; use e.g. float32, bfloat16, bool, int64"
        )
    return value


def make_inputs(
    module,
    model,
    *,
    specs: dict[str, InputSpec] | None = None,
    dims: dict[str, int] | None = None,
    device: str = "cpu",
) -> Inputs:
    """Inputs for `model(...)`, from the sources listed in this module's docstring."""
    specs = specs or {}
    dims = dict(dims or {})
    signature = _forward_signature(model)
    params = _params(signature)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for name in specs:
        if name not in params and not var_kw:
            raise LoadError(
                f"--input {name}: {type(model).__name__}.forward{_signature_text(signature)} has no "
                f"parameter {name!r}; name one of: {', '.join(params) or 'none'}"
            )
    dtype = _model_dtype(model)
    example = getattr(module, "example_inputs", None)
    if callable(example):
        args, kwargs = _call_example(example, device)
        if specs:
            bound = _bind(signature, args, kwargs, type(model).__name__)
            for name, spec in specs.items():
                bound[name] = _tensor(spec.shape, spec.dtype, dtype, device)
            args, kwargs = _split(params, bound)
        how = "example_inputs()" + (" with --input " + ", ".join(specs) if specs else "")
        return Inputs(args, kwargs, how)
    hints = _annotations(model)
    sizes = _Sizes(model, dims)
    values: dict[str, object] = {}
    sources: list[str] = []
    contract = {n: _jaxtyping_of(hints.get(n)) for n in params}
    # Bind every dim the annotations use before picking free sizes, so they stay distinct.
    for name, annotation in contract.items():
        if annotation is not None and name not in specs:
            sizes.reserve(annotation)
    first_required = True
    for name, param in params.items():
        if name in specs:
            spec = specs[name]
            values[name] = _tensor(spec.shape, spec.dtype, dtype, device)
            sources.append(f"--input {name}")
        elif contract[name] is not None:
            annotation = contract[name]
            shape = sizes.shape_for(annotation, name)
            values[name] = _tensor(shape, _dtype_for(annotation, dtype), dtype, device)
            if "the forward's annotations" not in sources:
                sources.append("the forward's annotations")
        elif param.default is param.empty:
            if first_required or name.lower() in _KV_NAMES:
                seq = "seq" if first_required else "seq_k"
                shape = (sizes.get("batch"), sizes.get(seq), sizes.d_model(name))
                values[name] = _tensor(shape, None, dtype, device)
                if "the [batch, seq, d_model] convention" not in sources:
                    sources.append("the [batch, seq, d_model] convention")
            else:
                raise LoadError(
                    f"cannot make input {name!r} for {type(model).__name__}.forward"
                    f"{_signature_text(signature)}: pass --input {name}=SIZES, or add "
                    "example_inputs() to the file"
                )
        first_required = False
    if not values:
        raise LoadError(
            f"cannot tell what {type(model).__name__}.forward{_signature_text(signature)} takes: "
            "pass --input NAME=SIZES, or add example_inputs() to the file"
        )
    args, kwargs = _split(params, values)
    named = ", ".join(f"{k}={v}" for k, v in sizes.bound.items())
    how = ", ".join(sources) + (f": {named}" if named else "")
    return Inputs(args, kwargs, how, dict(sizes.bound))


# -- the forward's signature -----------------------------------------------------------------


def _forward_signature(model) -> inspect.Signature:
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return inspect.Signature()


def _params(signature: inspect.Signature) -> dict[str, inspect.Parameter]:
    return {
        name: p
        for name, p in signature.parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _signature_text(signature: inspect.Signature) -> str:
    parts = []
    for p in signature.parameters.values():
        parts.append(p.name if p.default is p.empty else f"{p.name}=...")
    return "(" + ", ".join(parts) + ")"


def _bind(signature, args, kwargs, owner: str) -> dict:
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as error:
        raise LoadError(
            f"example_inputs() gives inputs that {owner}.forward{_signature_text(signature)} "
            f"does not take ({error}); fix example_inputs()"
        ) from None
    return dict(bound.arguments)


def _split(params: dict[str, inspect.Parameter], values: dict) -> tuple[tuple, dict]:
    """Positional arguments while the parameters come in order, keywords after."""
    args: list = []
    kwargs: dict = {}
    positional = True
    for name, param in params.items():
        if name not in values:
            if param.kind is not param.POSITIONAL_ONLY:
                positional = False
            continue
        if positional and param.kind is not param.KEYWORD_ONLY:
            args.append(values[name])
        else:
            kwargs[name] = values[name]
    for name, value in values.items():  # names only **kwargs takes
        if name not in params:
            kwargs[name] = value
    return tuple(args), kwargs


# -- example_inputs() ------------------------------------------------------------------------


def _call_example(example, device: str) -> tuple[tuple, dict]:
    import torch

    try:
        inspect.signature(example).bind()
    except TypeError:
        raise LoadError(
            "example_inputs() must be callable with no arguments; give its parameters defaults"
        ) from None
    except ValueError:
        pass
    context = torch.device(device) if device != "cpu" else contextlib.nullcontext()
    try:
        with context:
            result = example()
    except LoadError:
        raise
    except Exception as error:
        from ._loader import ModelCrashed

        raise ModelCrashed(
            "example_inputs()", error, inspect.getsourcefile(example) or ""
        ) from error
    args, kwargs = normalize_example(result)
    if device != "cpu":
        args = tuple(_move(a, device) for a in args)
        kwargs = {k: _move(v, device) for k, v in kwargs.items()}
    return args, kwargs


def normalize_example(result) -> tuple[tuple, dict]:
    """`example_inputs()`'s result as (args, kwargs).

    >>> normalize_example(((1, 2), {"mask": 3}))
    ((1, 2), {'mask': 3})
    >>> normalize_example((1, 2))
    ((1, 2), {})
    """
    if isinstance(result, dict):
        return (), dict(result)
    if isinstance(result, tuple | list):
        if len(result) == 2 and isinstance(result[0], tuple | list) and isinstance(result[1], dict):
            return tuple(result[0]), dict(result[1])
        return tuple(result), {}
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return (result,), {}
    raise LoadError(
        f"example_inputs() returned a {type(result).__name__}; return a tensor, a tuple of "
        "arguments, or (args, kwargs)"
    )


def _move(value, device: str):
    import torch

    if isinstance(value, torch.Tensor) and value.device.type != device:
        return value.to(device)
    return value


# -- annotations -----------------------------------------------------------------------------


def _annotations(model) -> dict:
    forward = type(model).forward
    try:
        return typing.get_type_hints(forward)
    except Exception:  # unresolvable string annotations: use what is there
        return dict(getattr(forward, "__annotations__", {}) or {})


def _jaxtyping_of(annotation):
    """The jaxtyping array annotation in `annotation` (also inside `X | None`), or None."""
    if annotation is None:
        return None
    if hasattr(annotation, "dim_str") and hasattr(annotation, "dims"):
        return annotation
    for member in typing.get_args(annotation):
        found = _jaxtyping_of(member)
        if found is not None:
            return found
    return None


def _dtype_for(annotation, model_dtype) -> str | None:
    names = tuple(getattr(annotation, "dtypes", ()) or ())
    model_name = str(model_dtype).removeprefix("torch.")
    if model_name in names:
        return model_name
    for name in ("float32", "bool", "int64", "int32", "float16", "bfloat16"):
        if name in names:
            return name
    return None


class _Sizes:
    """Sizes of named dims: `--dim`, then module attributes, then distinct free sizes."""

    def __init__(self, model, dims: dict[str, int]) -> None:
        self.model = model
        self.bound: dict[str, int] = dict(dims)
        self.declared = _declared_anywhere(model)

    def _attribute(self, name: str) -> int | None:
        value = getattr(self.model, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        for axis, names in _axes.ATTRIBUTE_AXES.items():
            if (name == axis or name in names) and axis in self.declared:
                return self.declared[axis][1]
        return None

    def get(self, name: str) -> int:
        if name in self.bound:
            return self.bound[name]
        size = self._attribute(name)
        if size is None:
            used = set(self.bound.values()) | {s for _, s in self.declared.values()}
            preferred = _PREFERRED.get(name.lower())
            pool = ((preferred,) if preferred else ()) + _POOL
            size = next((s for s in pool if s not in used), max(used | {1}) + 1)
        self.bound[name] = size
        return size

    def reserve(self, annotation) -> None:
        """Bind the attribute-backed dims first, so free sizes avoid them."""
        for dim in annotation.dims:
            name = getattr(dim, "name", None)
            if isinstance(name, str) and name not in self.bound:
                size = self._attribute(name)
                if size is not None:
                    self.bound[name] = size

    def d_model(self, param: str) -> int:
        if "d_model" in self.bound:
            return self.bound["d_model"]
        if "d_model" in self.declared:
            return self.get("d_model")
        size = _first_in_features(self.model)
        if size is None:
            raise LoadError(
                f"cannot tell the size of {param!r}: {type(self.model).__name__} declares no d_model "
                f"(attributes such as {', '.join(_axes.ATTRIBUTE_AXES['d_model'][:4])}); pass "
                f"--input {param}=2,5,D or --dim d_model=D, or add example_inputs() to the file"
            )
        self.bound["d_model"] = size
        return size

    def shape_for(self, annotation, param: str) -> tuple[int, ...]:
        shape: list[int] = []
        for dim in annotation.dims:
            kind = type(dim).__name__
            if hasattr(dim, "size") and isinstance(dim.size, int):  # a fixed dim such as 1
                shape.append(dim.size)
            elif hasattr(dim, "elem"):  # a symbolic dim such as "d_model//heads"
                shape.append(self._symbolic(dim.elem, param, annotation))
            elif isinstance(getattr(dim, "name", None), str) and "Variadic" not in kind:
                shape.append(self.get(dim.name))
            elif "Variadic" in kind:
                name = getattr(dim, "name", None)
                # One axis for `*batch`; none for an anonymous `...`.
                if isinstance(name, str):
                    shape.append(self.get(name))
            else:  # an anonymous `_` dim
                shape.append(self.get(f"_{param}_{len(shape)}"))
        return tuple(shape)

    def _symbolic(self, expression: str, param: str, annotation) -> int:
        namespace = dict(self.bound)
        for name in _names_in(expression):
            if name not in namespace:
                namespace[name] = self.get(name)
        try:
            value = eval(expression, {"__builtins__": {}}, namespace)  # noqa: S307 (the user's own annotation)
        except Exception:
            value = None
        if not isinstance(value, int) or value < 0:
            raise LoadError(
                f"cannot size {param!r} ({annotation.dim_str!r}): {expression!r} does not give a size; "
                f"pass --input {param}=SIZES or --dim for its names"
            )
        return value


def _names_in(expression: str) -> list[str]:
    import ast

    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        return []
    return [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]


def _declared_anywhere(model) -> dict[str, tuple[str, int]]:
    """Sizes the model declares, else the first submodule that declares each."""
    found = dict(_axes.declared_sizes(model))
    for sub in model.modules():
        for axis, value in _axes.declared_sizes(sub).items():
            found.setdefault(axis, value)
        if len(found) == len(_axes.ATTRIBUTE_AXES):
            break
    return found


def _first_in_features(model) -> int | None:
    import torch

    for sub in model.modules():
        if isinstance(sub, torch.nn.Linear):
            return sub.in_features
        if isinstance(sub, torch.nn.LayerNorm | torch.nn.RMSNorm) and sub.normalized_shape:
            return int(sub.normalized_shape[-1])
    return None


def _model_dtype(model):
    import torch

    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _tensor(shape, dtype_name: str | None, model_dtype, device: str):
    import torch

    dtype = _dtype(dtype_name) if dtype_name else model_dtype
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, dtype=dtype, device=device)
    # Integer inputs are usually token ids: 0 is valid for any embedding.
    return torch.zeros(shape, dtype=dtype, device=device)
