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
4. The model's own structure (`_cli.inputs_structure`): token ids for a parameter that
   feeds the first nn.Embedding, activations as wide as the Linear (or norm, conv,
   nn.MultiheadAttention) that reads them, a dict or dataclass batch of those, and
   masks with real padding in the polarity of the op that reads them, starting from
   the convention `[batch, seq, d_model]` for the first parameter (d_model read from
   the module, attribute names in `shapeguard._names.axes.ATTRIBUTE_AXES`) and
   `[batch, seq_k, d_model]` for parameters named like keys or values (`key`, `value`,
   `memory`, `context`).

A mask made here or sized by `--input` holds padding: the first example full, the
others shorter, with distinct lengths.

On `device="meta"` every tensor is made on the meta device: no memory.
"""

import contextlib
import inspect
import typing
from dataclasses import dataclass, field

from .. import _source
from .._names import axes as _axes
from .._values import dtype_name, is_tensor
from ..report.text import tensor_text
from . import inputs_signature as _sig
from . import inputs_structure as _structure
from .input_sizes import check_indexable, dtype_of
from .inputs_blame import Reads, reads_of
from .inputs_discovery import discover, leaves_of
from .inputs_guess import batch_for, guess_leaf, pad_ids, smallest_vocab
from .inputs_making import Maker
from .loader import LoadError

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
    # {parameter or field: what its values are} for the inputs line ("ids < 101").
    notes: dict = field(default_factory=dict)
    # {parameter: "[2, 5, 64] float32"} for the inputs shapeguard made up (not the user's).
    made: dict = field(default_factory=dict)
    # Tensors made [seq, batch, features] for an nn.MultiheadAttention(batch_first=False).
    seq_first: list = field(default_factory=list)
    # What a forward read of the inputs made up, by line (`inputs_blame`), or None.
    reads: "Reads | None" = None

    def claim_layouts(self, session) -> None:
        """Tell a trace's session the layout of the inputs made seq-first: what reads them
        says so, which is more than the usual [batch, seq, features] of a model's input."""
        from .._names import dims

        for tensor in self.seq_first:
            axes = session.meta_of(tensor).dims
            dims.claim_atoms(axes[0], dims.TOKEN, dims.STRUCTURE, "seq")
            dims.claim_atoms(axes[1], dims.BATCH, dims.STRUCTURE, "batch")


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
            dtype_of(dtype, item)
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
        check_indexable(f"--input {item}", shape)
        # A name given again is the next positional input of a `forward(*args)`.
        key = name
        while key in specs:
            key = _sig.positional_key(name, sum(spec.name == name for spec in specs.values()))
        specs[key] = InputSpec(name, shape, dtype)
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
        check_indexable(f"--dim {item}", (size,))
        dims[name] = size
    return dims


def make_inputs(
    module,
    model,
    *,
    specs: dict[str, InputSpec] | None = None,
    dims: dict[str, int] | None = None,
    device: str = "cpu",
) -> Inputs:
    """Inputs for `model(...)`, from the sources listed in this module's docstring."""
    dims = dict(dims or {})
    signature = _sig.forward_signature(model)
    params = _sig.named_params(signature)
    specs = _sig.keyed_specs(specs or {}, signature, type(model).__name__)

    def split(values: dict) -> tuple[tuple, dict]:
        return _sig.split(signature, values)

    maker = Maker(_model_dtype(model), device, pads=pad_ids(model), vocab=smallest_vocab(model))
    sizes = _Sizes(model, dims)
    example = getattr(module, "example_inputs", None)
    if callable(example):
        args, kwargs = _call_example(example, device)
        if not specs:
            return Inputs(args, kwargs, "example_inputs()")
        bound = _bind(signature, args, kwargs, type(model).__name__)
        nodes: dict[str, _structure.Leaf | _structure.Batch] = {
            name: _spec_leaf(spec) for name, spec in specs.items()
        }

        def assemble(values: dict) -> tuple[tuple, dict]:
            return split({**bound, **values})

        values = _made(model, nodes, assemble, maker, sizes)
        args, kwargs = assemble(values)
        how = "example_inputs() with --input " + ", ".join(specs)
        return Inputs(args, kwargs, how, notes=_notes(nodes, maker))
    hints = _annotations(model)
    contract = {n: _jaxtyping_of(hints.get(n)) for n in params}
    # Bind every dim the annotations use before picking free sizes, so they stay distinct.
    for name, annotation in contract.items():
        if annotation is not None and name not in specs:
            sizes.reserve(annotation)
    nodes = {}
    sources: dict[str, str] = {}
    # A forward whose every parameter is optional (HF's `input_ids=None, attention_mask=None,
    # ...`) gets its first one, and its `attention_mask` beside token ids.
    # A flag (`is_training=False`) is never made up.
    tensors = {n: p for n, p in params.items() if not _sig.is_flag(p)}
    wanted = {n for n, p in tensors.items() if p.default is p.empty}
    if not wanted and tensors and not specs:
        first = next(iter(tensors))
        wanted = {first}
        if _structure.is_ids_name(first) and "attention_mask" in params:
            wanted.add("attention_mask")
    first_required = True
    for name in [*params, *(key for key in specs if key not in params)]:
        if name in specs:
            nodes[name] = _spec_leaf(specs[name], name)
            sources[name] = f"--input {specs[name].name}"
        elif contract.get(name) is not None:
            annotation = contract[name]
            nodes[name] = _annotated_leaf(name, annotation, sizes, model)
            sources[name] = "the forward's annotations"
        elif name in wanted:
            batch = batch_for(name, hints.get(name), model, type(model).forward, sizes)
            nodes[name] = batch or guess_leaf(
                name, model, sizes, first=first_required, keys=name.lower() in _KV_NAMES
            )
            sources[name] = ""
        first_required = False
    if not nodes:
        raise LoadError(
            f"cannot tell what {type(model).__name__}.forward{_sig.signature_text(signature)} "
            f"takes: pass --input {_sig.spelling(signature)}, or add example_inputs() to the file"
        )
    guessed = {name: leaves_of(node)[0].shape for name, node in nodes.items()}
    values = _made(model, nodes, split, maker, sizes)
    for name, node in nodes.items():
        if not sources[name]:
            learned = (
                isinstance(node, _structure.Batch)
                or node.kind != _structure.FLOAT
                or node.shape != guessed[name]
            )
            sources[name] = (
                "the model's structure" if learned else "the [batch, seq, d_model] convention"
            )
    args, kwargs = split(values)
    named = ", ".join(f"{k}={v}" for k, v in sizes.bound.items())
    how = ", ".join(dict.fromkeys(sources.values())) + (f": {named}" if named else "")
    made = {
        name: tensor_text(values[name])
        for name, source in sources.items()
        if "--input" not in source
    }
    seq_first = [
        values[name]
        for name, node in nodes.items()
        if isinstance(node, _structure.Leaf) and node.layout == "seq_first"
    ]
    notes = _notes(nodes, maker)
    reads = reads_of(model, nodes, split, maker, notes)
    return Inputs(args, kwargs, how, dict(sizes.bound), notes, made, seq_first, reads)


def _made(model, nodes: dict, assemble, maker, sizes) -> dict:
    """The values of `nodes` once what consumes them has been read (`discover`)."""
    discover(model, nodes, assemble, maker, sizes)
    for node in nodes.values():
        for leaf in leaves_of(node):
            if leaf.unsure:
                raise LoadError(
                    f"cannot tell the size of {leaf.name!r}: {type(model).__name__} declares no "
                    f"d_model (attributes such as {', '.join(_axes.ATTRIBUTE_AXES['d_model'][:4])}); "
                    f"pass --input {leaf.name}=2,5,D or --dim d_model=D, or add example_inputs() "
                    "to the file"
                )
    return {name: maker.value(node) for name, node in nodes.items()}


def _notes(nodes: dict, maker) -> dict:
    """{leaf: what its values are}: the ids drawn (`ids 1..100`), a mask's padding."""
    import torch

    notes = {}
    for node in nodes.values():
        for leaf in leaves_of(node):
            dtype = dtype_of(leaf.dtype_name(maker.model_dtype), leaf.name)
            integers = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
            ids = maker.ids_note(leaf) if integers else ""
            note = leaf.note(maker.lengths.get(id(leaf), ()), ids)
            if note:
                notes[leaf.name] = note
    return notes


def _spec_leaf(spec: InputSpec, key: str = ""):
    """A leaf of the size and dtype `--input` gave; what its values are is read from what
    consumes it (ids for an embedding, padding for a mask)."""
    dtype = spec.dtype and dtype_name(dtype_of(spec.dtype, spec.name))
    kind = _structure.FLOAT
    if _structure.is_mask_name(spec.name) or dtype == "bool":
        kind = _structure.MASK
    elif dtype is not None and not (dtype.startswith(("float", "bfloat", "complex"))):
        kind = _structure.IDS
    return _structure.Leaf(key or spec.name, kind, spec.shape, dtype, fixed=True)


def _annotated_leaf(name: str, annotation, sizes, model):
    dtype = _dtype_for(annotation, _model_dtype(model))
    shape = sizes.shape_for(annotation, name)
    kind = _structure.FLOAT
    if dtype == "bool" or (_structure.is_mask_name(name) and dtype is None):
        kind = _structure.MASK
    elif dtype in ("int64", "int32"):
        kind = _structure.IDS
    return _structure.Leaf(name, kind, shape, dtype, fixed=True)


# -- the forward's signature -----------------------------------------------------------------


def _bind(signature, args, kwargs, owner: str) -> dict:
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError as error:
        raise LoadError(
            f"example_inputs() gives inputs that {owner}.forward{_sig.signature_text(signature)} "
            f"does not take ({error}); fix example_inputs()"
        ) from None
    return dict(bound.arguments)


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
        from .loader import ModelCrashed

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
    if is_tensor(result):
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
    model_name = dtype_name(model_dtype)
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

    def width(self) -> int | None:
        """d_model, from `--dim`, the model's declarations or its first Linear; None when
        nothing says (a consumer of the input may tell, `inputs_discovery.discover`)."""
        if "d_model" in self.bound:
            return self.bound["d_model"]
        if "d_model" in self.declared:
            return self.get("d_model")
        size = _first_in_features(self.model)
        if size is not None:
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
        tree = _source.parse(expression, mode="eval")
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
