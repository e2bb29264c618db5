"""First guesses at a forward's inputs from what the model declares: its first
Embedding takes token ids, `mask` in a name makes a mask, a dataclass annotation or
`batch["tokens"]` in the forward makes a batch (`inputs_structure`)."""

import ast
import dataclasses
import inspect
import textwrap
import typing

from .. import _source
from .inputs_structure import FLOAT, IDS, MASK, Batch, Leaf, is_ids_name, is_mask_name
from .inputs_uses import describe_module, module_path
from .loader import LoadError


def first_embedding(model):
    """The model's first leaf module with parameters, when it is an nn.Embedding."""
    import torch

    for module in model.modules():
        if (
            next(module.children(), None) is None
            and next(module.parameters(False), None) is not None
        ):
            return module if isinstance(module, torch.nn.Embedding) else None
    return None


def any_embedding(model):
    import torch

    return next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)


def pad_ids(model) -> frozenset[int]:
    """The padding ids the model declares: its embeddings' `padding_idx`, and an int
    attribute of the model or its `config` named as a padding id (`pad_token_id`,
    `pad_idx`, `trg_pad_idx`). Made-up ids leave them out; one left out wrongly costs
    nothing but an id."""
    import torch

    pads = {
        int(m.padding_idx)
        for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None
    }
    for owner in (model, getattr(model, "config", None)):
        for name, value in (vars(owner) if hasattr(owner, "__dict__") else {}).items():
            low = name.lower()
            if (
                "pad" in low
                and low.endswith(("idx", "_id", "token_id"))
                and isinstance(value, int)
                and not isinstance(value, bool)
                and value >= 0
            ):
                pads.add(value)
    return frozenset(pads)


def smallest_vocab(model) -> int:
    """The smallest `num_embeddings` of the model's embeddings (0: it has none): an id
    below it is valid for any of them."""
    import torch

    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    return min(sizes, default=0)


def guess_leaf(name: str, model, sizes, *, first: bool, keys: bool) -> Leaf:
    """A leaf for a parameter the user gave nothing for, from names and declarations."""
    batch = sizes.get("batch")
    seq = sizes.get("seq_k" if keys else "seq")
    if is_mask_name(name):
        return Leaf(name, MASK, (batch, seq))
    embedding = first_embedding(model) if first else None
    if embedding is None and is_ids_name(name):
        embedding = any_embedding(model)
    if embedding is not None:
        why = f"{module_path(model, embedding)} = {describe_module(embedding)}"
        return Leaf(name, IDS, (batch, seq), vocab=embedding.num_embeddings, why=why)
    width = sizes.width()
    return Leaf(name, FLOAT, (batch, seq, width or 8), unsure=width is None)


def batch_for(name: str, annotation, model, forward, sizes) -> Batch | None:
    """A Batch for a parameter annotated as a dataclass or a TypedDict, or indexed with
    string keys (`batch["tokens"]`) or read by attribute (`batch.tokens`) in the forward."""
    import torch

    annotation = _unwrap_optional(annotation)
    fields: list[str] = []
    kind, cls = "", None
    if inspect.isclass(annotation) and dataclasses.is_dataclass(annotation):
        hints = _hints(annotation)
        kind, cls = "dataclass", annotation
        for f in dataclasses.fields(annotation):
            if _is_tensor_type(hints.get(f.name)):
                fields.append(f.name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise LoadError(
                    f"cannot make {annotation.__name__}.{f.name} for {name!r}: it is not a "
                    "tensor and has no default; add example_inputs() to the file"
                )
    elif _is_typed_dict(annotation):
        kind = "dict"
        fields = [k for k, v in _hints(annotation).items() if _is_tensor_type(v)]
    else:
        keys, attributes = _reads_of(forward, name)
        if keys and (annotation is None or _is_mapping(annotation)):
            kind, fields = "dict", keys
        elif attributes and annotation is None:
            attributes = [a for a in attributes if not hasattr(torch.Tensor, a)]
            if attributes:
                kind, fields = "namespace", attributes
    if not kind or not fields:
        return None
    leaves = {}
    for i, key in enumerate(fields):
        leaf = guess_leaf(key, model, sizes, first=i == 0, keys=False)
        leaf.name = f"{name}[{key!r}]" if kind == "dict" else f"{name}.{key}"
        leaves[key] = leaf
    return Batch(name, kind, leaves, cls)


def _unwrap_optional(annotation):
    args = typing.get_args(annotation)
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _hints(cls) -> dict:
    try:
        return typing.get_type_hints(cls)
    except Exception:
        return dict(getattr(cls, "__annotations__", {}) or {})


def _is_typed_dict(annotation) -> bool:
    return (
        inspect.isclass(annotation)
        and issubclass(annotation, dict)
        and hasattr(annotation, "__required_keys__")
    )


def _is_mapping(annotation) -> bool:
    import collections.abc

    origin = typing.get_origin(annotation) or annotation
    return inspect.isclass(origin) and issubclass(origin, collections.abc.Mapping)


def _is_tensor_type(annotation) -> bool:
    import torch

    annotation = _unwrap_optional(annotation)
    if annotation is None:
        return False
    if inspect.isclass(annotation) and issubclass(annotation, torch.Tensor):
        return True
    return hasattr(annotation, "dim_str") and hasattr(annotation, "dims")  # jaxtyping


def _reads_of(forward, name: str) -> tuple[list[str], list[str]]:
    """String keys (`name["k"]`, `name.get("k")`) and attributes (`name.k`) the forward reads."""
    try:
        tree = _source.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return [], []
    keys: list[str] = []
    attributes: list[str] = []

    def is_param(node) -> bool:
        return isinstance(node, ast.Name) and node.id == name

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_param(node.value):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.append(key.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and is_param(node.func.value)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            keys.append(node.args[0].value)
        elif isinstance(node, ast.Attribute) and is_param(node.value) and node.attr != "get":
            attributes.append(node.attr)
    ordered = sorted(set(keys), key=keys.index), sorted(set(attributes), key=attributes.index)
    return ordered
