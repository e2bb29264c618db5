"""Inputs made from the model's own structure, when the user gives none.

Each forward parameter becomes a `Leaf` (one tensor: activations, token ids or a mask)
or a `Batch` of leaves (a dict, a dataclass, a namespace). A first guess comes from what
the model declares (its first Embedding takes token ids; `mask` in a name makes a mask;
a dataclass annotation or `batch["tokens"]` in the forward makes a batch). Then one
provisional forward, observed through a session with checks off (`run_observed`) and
with module pre-hooks of this module's own, watches what consumes each input first
(`discover`):

- an `nn.Embedding` (or `F.embedding`): token ids, int64 below its num_embeddings;
- an `nn.Linear`, a norm, a conv, `nn.MultiheadAttention`: activations of the width it
  takes, in its layout;
- a mask: the op that applies it to scores. A mask the op reads as it is gets that op's
  polarity (masked_fill and nn.MultiheadAttention's key_padding_mask: True hides; SDPA's
  attn_mask and torch.where: True keeps; added to scores: 0 keeps, -inf hides); a mask
  the code transforms first (`mask == 0`, `~mask`, `1.0 - mask`) follows the common
  convention, 1 marks a real token. Its shape is fitted to the scores it meets.

The inputs are made again until nothing changes. Masks hold real padding: the first
example full, the others shorter with distinct lengths, so the value checks have
something to test. The provisional forward leaves the user's state as it was: no grad,
train/eval modes restored, the RNG untouched, shapeguard's own checks paused; it stops
as soon as every input has been read.
"""

import ast
import dataclasses
import inspect
import textwrap
import typing
import zlib
from dataclasses import dataclass

from .. import _ops, _source
from .loader import LoadError

FLOAT, IDS, MASK = "float", "ids", "mask"
# Mask polarity: True (1) marks a real token; True marks padding; additive (0 / -inf).
KEEP, HIDE, ADD = "keep", "hide", "add"

_ID_NAMES = frozenset(
    {"idx", "ids", "tokens", "input_ids", "token_ids", "input_tokens", "src_ids", "tgt_ids"}
)
_SUBTRACTS = frozenset({_ops.by_name("sub"), _ops.by_name("neg")})
# Ops that hand on an input unchanged in meaning: a mask through them is still the raw mask.
_PASS_FAMILIES = frozenset({_ops.VIEW, _ops.LAYOUT, _ops.INDEX, _ops.GROW, _ops.PART})
_DROPOUT = _ops.by_name("dropout")
# How a mask meets scores by arithmetic (added: 0 / -inf; multiplied: 1 keeps), and the
# norms whose normalized_shape is the width of the activations they read.
_MIXES = (_ops.by_name("add"), _ops.by_name("mul"))
_NORMS = (_ops.by_name("layer_norm"), _ops.by_name("rms_norm"))
_MAX_ROUNDS = 4
# Buffers up to this many elements are saved before a provisional forward and put back.
_BUFFER_LIMIT = 1 << 24


def is_ids_name(name: str) -> bool:
    low = name.lower()
    return low in _ID_NAMES or low.endswith(("_ids", "_tokens", "_idx"))


def is_mask_name(name: str) -> bool:
    low = name.lower()
    return "mask" in low or "padding" in low or low.startswith("pad")


@dataclass(eq=False, slots=True)
class Leaf:
    """One tensor to make: what it is, its shape, and what the shape was read from."""

    name: str  # "x", "batch['tokens']", "batch.mask"
    kind: str  # FLOAT, IDS or MASK
    shape: tuple[int, ...]
    dtype: str | None = None  # None: the model's dtype (FLOAT), int64 (IDS), bool (MASK)
    vocab: int = 0  # IDS: ids are below it (0: all zeros)
    polarity: str = KEEP  # MASK
    padded: bool = True  # MASK: some examples shorter (False: nothing hidden)
    fixed: bool = False  # shape and dtype given by --input or an annotation
    why: str = ""  # what read it: "tok_emb = nn.Embedding(101, 48)"
    layout: str = "batch_first"  # or "seq_first", for nn.MultiheadAttention(batch_first=False)
    unsure: bool = False  # its width is a placeholder until something reads it
    # Set while a provisional forward watches it.
    use: "_Use | None" = None

    def dtype_name(self, model_dtype: str) -> str:
        if self.dtype:
            return self.dtype
        if self.kind == IDS:
            return "int64"
        if self.kind == MASK:
            return model_dtype if self.polarity == ADD else "bool"
        return model_dtype

    def note(self, lengths: tuple[int, ...]) -> str:
        """What its values are, for the inputs line: `ids < 101`, `True = padding; lengths 5, 3`."""
        if self.kind == IDS:
            return f"ids < {self.vocab}" if self.vocab else ""
        if self.kind != MASK:
            return ""
        if not self.padded:
            return "hides nothing"
        marks = {
            KEEP: "True = real token" if self.dtype in (None, "bool") else "1 = real token",
            HIDE: "True = padding",
            ADD: "0 = real token, -inf = padding",
        }[self.polarity]
        return f"{marks}; lengths {', '.join(map(str, lengths))}" if lengths else marks


@dataclass(eq=False, slots=True)
class Batch:
    """A forward parameter that is a dict, a dataclass or a namespace of tensors."""

    name: str
    kind: str  # "dict", "dataclass" or "namespace"
    fields: dict[str, Leaf]
    cls: type | None = None


@dataclass(slots=True)
class _Use:
    """The first thing that read a leaf (for a mask: the op that applied it to scores)."""

    what: str  # "module", "mha", "conv1d", or an op's name
    via: str  # "direct": the leaf itself, "view": views and casts of it, "arith": more
    module: object = None
    param: str = ""  # the module's parameter it went to
    shape: tuple = ()  # the shape of what the op got (the leaf, or what was made of it)
    target: tuple = ()  # for a mask: the shape of the scores it met
    width: int | None = None
    vocab: int | None = None
    polarity: str = ""  # for a mask: what the op reads (KEEP, HIDE, ADD)
    subtracted: bool = False  # a bool mask went into `1 - mask`: it must be a number


# -- first guesses ---------------------------------------------------------------------------


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
        why = f"{_path(model, embedding)} = {_describe(embedding)}"
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


# -- making the tensors ----------------------------------------------------------------------


class Maker:
    """Makes the tensors of leaves: sized and checked first, values from a private generator."""

    def __init__(self, model_dtype, device: str) -> None:
        self.model_dtype = str(model_dtype).removeprefix("torch.")
        self.device = device
        self.lengths: dict[int, tuple[int, ...]] = {}

    def value(self, node):
        if isinstance(node, Leaf):
            return self.tensor(node)
        values = {key: self.tensor(leaf) for key, leaf in node.fields.items()}
        if node.kind == "dataclass":
            return node.cls(**values)
        if node.kind == "namespace":
            import types

            return types.SimpleNamespace(**values)
        return values

    def tensor(self, leaf: Leaf):
        import torch

        from .input_sizes import check_size, dtype_of

        dtype = dtype_of(leaf.dtype_name(self.model_dtype), leaf.name)
        check_size(leaf.name, leaf.shape, dtype, self.device)
        if self.device != "cpu":
            return torch.empty(leaf.shape, dtype=dtype, device=self.device)
        generator = torch.Generator().manual_seed(zlib.crc32(leaf.name.encode()))
        try:
            if leaf.kind == MASK:
                return self._mask(leaf, dtype)
            if leaf.kind == IDS and leaf.vocab and not dtype.is_floating_point:
                high = leaf.vocab if dtype != torch.bool else 2
                return torch.randint(0, high, leaf.shape, generator=generator, dtype=dtype)
            if dtype.is_floating_point or dtype.is_complex:
                return torch.randn(leaf.shape, generator=generator, dtype=dtype)
            if dtype == torch.bool:
                return torch.ones(leaf.shape, dtype=dtype)
            # Integers of unknown use: 0 is a valid id for any embedding.
            return torch.zeros(leaf.shape, dtype=dtype)
        except (RuntimeError, MemoryError) as error:
            from .input_sizes import memory_error

            raise memory_error(leaf.name, leaf.shape, dtype, self.device, error) from None

    def _mask(self, leaf: Leaf, dtype):
        """Padding along the last axis (the keys), one row per example along the first."""
        import torch

        shape = leaf.shape
        seq = shape[-1] if shape else 1
        rows = shape[0] if len(shape) >= 2 else 1
        lengths = padded_lengths(rows, seq) if leaf.padded else (seq,) * rows
        self.lengths[id(leaf)] = lengths if leaf.padded and len(shape) >= 2 else ()
        real = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]  # [rows, seq]
        if len(shape) >= 2:
            real = real.view(rows, *([1] * (len(shape) - 2)), seq).expand(shape).clone()
        else:
            real = real[0].expand(shape).clone()
        if leaf.polarity == ADD:
            low = torch.finfo(dtype).min if dtype.is_floating_point else -(10**9)
            return torch.where(real, torch.zeros((), dtype=dtype), torch.full((), low, dtype=dtype))
        hidden = ~real if leaf.polarity == HIDE else real
        return hidden.to(dtype)


def padded_lengths(rows: int, seq: int) -> tuple[int, ...]:
    """The first example full, the others shorter, distinct while the length allows.

    >>> padded_lengths(2, 5), padded_lengths(4, 5), padded_lengths(3, 2)
    ((5, 3), (5, 3, 2, 1), (2, 1, 1))
    """
    return (seq, *(max(1, seq - 1 - i) for i in range(1, rows)))


# -- what consumes each input ------------------------------------------------------------------


class _Done(BaseException):
    """Every input has been read: the provisional forward stops here (a BaseException, so
    the model's own `except Exception` does not catch it)."""


def discover(model, nodes: dict, assemble, maker: Maker, sizes) -> None:
    """Refine `nodes` ({parameter: Leaf | Batch}) from what consumes each leaf in a
    provisional forward of `model(*assemble(values))`, until nothing changes.

    Best effort: a forward that fails is a forward that taught less; nothing here raises
    but the LoadError of an input too large to make.
    """
    leaves = [leaf for node in nodes.values() for leaf in leaves_of(node)]
    if not leaves:
        return
    flipped: set[int] = set()
    for _ in range(_MAX_ROUNDS):
        values = {name: maker.value(node) for name, node in nodes.items()}
        args, kwargs = assemble(values)
        tensors = {}
        for name, node in nodes.items():
            for leaf, tensor in zip(leaves_of(node), _tensors(node, values[name]), strict=True):
                tensors[id(tensor)] = (leaf, tensor)
        for leaf in leaves:
            leaf.use = None
        failed = _watch(model, args, kwargs, tensors, leaves)
        changed = False
        for leaf in leaves:
            if leaf.use is not None:
                changed |= _refine(leaf, leaf.use, model, sizes)
        if changed:
            continue
        # The forward failed before reading a leaf: maybe the first guess was the wrong
        # kind (`B, T = x.shape` on activations made for token ids, or the reverse).
        unread = [
            leaf
            for leaf in leaves
            if failed and leaf.use is None and not leaf.fixed and id(leaf) not in flipped
        ]
        if not unread or not _flip(unread[0], model, sizes):
            break
        flipped.add(id(unread[0]))
    for leaf in leaves:
        leaf.use = None


def leaves_of(node) -> list[Leaf]:
    return [node] if isinstance(node, Leaf) else list(node.fields.values())


def _tensors(node, value) -> list:
    if isinstance(node, Leaf):
        return [value]
    if node.kind == "dict":
        return [value[key] for key in node.fields]
    return [getattr(value, key) for key in node.fields]


def _flip(leaf: Leaf, model, sizes) -> bool:
    embedding = any_embedding(model)
    if leaf.kind == FLOAT and embedding is not None:
        leaf.kind, leaf.shape, leaf.vocab = IDS, leaf.shape[:2], embedding.num_embeddings
        leaf.why = f"{_path(model, embedding)} = nn.Embedding({embedding.num_embeddings}, ...)"
        return True
    if leaf.kind == IDS:
        width = sizes.width()
        if width is None:
            return False
        leaf.kind, leaf.shape, leaf.vocab = FLOAT, (*leaf.shape[:2], width), 0
        return True
    return False


def _watch(model, args, kwargs, tensors: dict, leaves: list[Leaf]) -> bool:
    """One provisional forward; each leaf's `use` is set to what read it. True when the
    forward raised (other than stopping because every leaf was read)."""
    import torch

    from .._trace.tracing import run_observed

    watcher = _Watcher(tensors, leaves, model)
    training = {m: m.training for m in model.modules()}
    # A forward may write into its buffers (a cache, a step count): put back what it wrote.
    buffers = [b for b in model.buffers() if b.device.type == "cpu" and b.numel() <= _BUFFER_LIMIT]
    saved = [(b, b._version, b.detach().clone()) for b in buffers]
    # Local hooks on torch's own modules: a global pre-hook gets no keyword arguments.
    handles = [
        m.register_forward_pre_hook(watcher.module_call, with_kwargs=True)
        for m in model.modules()
        if type(m).__module__.startswith("torch.nn.")
    ]
    failed = False
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            run_observed(model, args, kwargs, lambda session: _Observing(watcher))
    except _Done:
        pass
    except Exception:
        failed = True
    finally:
        for handle in handles:
            handle.remove()
        for module, flag in training.items():
            module.training = flag
        with torch.no_grad():
            for buffer, version, value in saved:
                if buffer._version != version and buffer.shape == value.shape:
                    buffer.copy_(value)
    return failed


class _Observing:
    """The session's observer (`_trace.tracing.run_observed`) for a `_Watcher`: what an
    op reads, before it runs; what its output carries on, after."""

    __slots__ = ("follow", "watcher")

    def __init__(self, watcher: "_Watcher") -> None:
        self.watcher = watcher
        self.follow: list = []

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None:
        self.follow = self.watcher.before(_ops.lookup(op), op, args, kwargs)

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None:
        follow, self.follow = self.follow, []
        self.watcher.after(follow, out)


class _Watcher:
    """Follows the leaves and what is made of them through one forward."""

    def __init__(self, tensors: dict, leaves: list[Leaf], model) -> None:
        # id(tensor) -> (leaf, via, tensor): the tensor is kept, so its id is not reused.
        self.tracked = {key: (leaf, "direct", tensor) for key, (leaf, tensor) in tensors.items()}
        self.leaves = leaves
        self.model = model
        self.open = {id(leaf) for leaf in leaves}  # not resolved yet

    def _done(self) -> None:
        if not self.open:
            raise _Done

    def _resolve(self, leaf: Leaf, use: _Use) -> None:
        if id(leaf) in self.open:
            if leaf.use is not None and leaf.use.subtracted:
                use.subtracted = True
            leaf.use = use
            self.open.discard(id(leaf))

    # -- torch's own modules -------------------------------------------------------------
    def module_call(self, module, args, kwargs):
        if not type(module).__module__.startswith("torch.nn."):
            return None
        try:
            bound = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
        except (TypeError, ValueError):
            return None
        hit = False
        for param, value in bound.items():
            entry = self.tracked.get(id(value))
            if entry is None or id(entry[0]) not in self.open:
                continue
            use = _module_use(module, param, entry[1], value, bound)
            if use is not None:
                self._resolve(entry[0], use)
                hit = True
        if hit:
            self._done()
        return None

    # -- ops ---------------------------------------------------------------------------
    def before(self, op, spelling: str, args: tuple, kwargs: dict) -> list:
        """Resolve the leaves this op reads; return those its output still carries
        (through views and casts, and for a mask through elementwise ops), for `after`."""
        found = []
        for value in _flat(args, kwargs):
            entry = self.tracked.get(id(value))
            if entry is not None and id(entry[0]) in self.open:
                found.append((entry, value))
        if not found:
            return []
        bound = _ops.bind(op, args, kwargs)
        # Views, casts and copies (the table's value-keeping ops) and dropout pass an input on.
        keeps = (
            op.family in _PASS_FAMILIES
            or (op.family == _ops.SAME and op.keeps_value and op.keeps_label)
            or op is _DROPOUT
        )
        follow = []
        for (leaf, via, _), value in found:
            if leaf.kind == MASK:
                use = _mask_use(op, bound, via, value, args, self.tracked)
                if use is not None:
                    self._resolve(leaf, use)
                elif keeps:
                    follow.append((leaf, "view" if via == "direct" else via))
                elif op.family in (_ops.SAME, _ops.BINARY):
                    if leaf.use is None:  # the first thing the code does with the mask
                        leaf.use = _Use(op.name, via, shape=_shape(value))
                        leaf.use.subtracted = (
                            op in _SUBTRACTS and via != "arith" and _is_bool(value)
                        )
                    follow.append((leaf, "arith"))
                else:
                    self._resolve(leaf, _Use(op.name, via, shape=_shape(value)))
            elif keeps:
                follow.append((leaf, "view" if via == "direct" else via))
            else:
                self._resolve(leaf, _op_use(op, bound, via, value))
        self._done()
        return follow

    def after(self, follow: list, out) -> None:
        for tensor in _out_tensors(out) if follow else ():
            for leaf, via in follow:
                self.tracked.setdefault(id(tensor), (leaf, via, tensor))


def _mask_use(op, bound: dict, via: str, value, args: tuple, tracked: dict) -> _Use | None:
    """The use of a mask by an op that applies it to scores (or features), else None."""
    name = op.name
    target, polarity = None, ""
    if name == "masked_fill" and bound.get("mask") is value:
        target, polarity = _shape(bound.get("input")), HIDE
    elif name == "where" and bound.get("condition") is value:
        target, polarity = _broadcast(bound.get("input"), bound.get("other")), KEEP
    elif name == "scaled_dot_product_attention" and bound.get("attn_mask") is value:
        q, k = bound.get("query"), bound.get("key")
        if q is not None and k is not None:
            target = (*_shape(q)[:-1], _shape(k)[-2])
        polarity = KEEP if _is_bool(value) else ADD
    elif op in _MIXES:
        others = [a for a in args if a is not value and hasattr(a, "shape") and a.dim() > 0]
        if others and id(others[0]) not in tracked:
            target, polarity = _broadcast(others[0], value), ADD if name == "add" else KEEP
    if target is None:
        return None
    # A mask the code transforms first is read in the common convention: 1 is a real token.
    return _Use(name, via, shape=_shape(value), target=tuple(target), polarity=(
        polarity if via != "arith" else KEEP
    ))  # fmt: skip


def _module_use(module, param: str, via: str, value, bound: dict) -> _Use | None:
    import torch
    from torch import nn

    shape = _shape(value)
    if isinstance(module, nn.Embedding):
        return _Use("module", via, module, param, shape, vocab=module.num_embeddings)
    if isinstance(module, nn.Linear):
        return _Use("module", via, module, param, shape, width=module.in_features)
    if isinstance(module, nn.LayerNorm | nn.RMSNorm) and module.normalized_shape:
        return _Use("module", via, module, param, shape, width=int(module.normalized_shape[-1]))
    if isinstance(module, nn.Conv1d) and param == "input":
        return _Use("conv1d", via, module, param, shape, width=module.in_channels)
    if isinstance(module, nn.MultiheadAttention):
        if param in ("query", "key", "value"):
            width = {"query": module.embed_dim, "key": module.kdim, "value": module.vdim}[param]
            return _Use("mha", via, module, param, shape, width=width)
        if param in ("key_padding_mask", "attn_mask"):
            key = bound.get("key")
            target: tuple[int, ...] = ()
            if isinstance(key, torch.Tensor) and key.dim() == 3:
                batch, seq = (
                    (key.shape[0], key.shape[1])
                    if module.batch_first
                    else (
                        key.shape[1],
                        key.shape[0],
                    )
                )
                query = bound.get("query")
                seq_q = query.shape[1 if module.batch_first else 0] if query is not None else seq
                target = (
                    (int(batch), int(seq))
                    if param == "key_padding_mask"
                    else (int(seq_q), int(seq))
                )
            use = _Use("mha", via, module, param, shape, target=target)
            return use
    layers = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder)
    if isinstance(module, layers):
        layer = module.layers[0] if isinstance(module, nn.TransformerEncoder) else module
        if param in ("src", "tgt", "memory"):
            return _Use(
                "mha", via, layer.self_attn, "query", shape, width=layer.self_attn.embed_dim
            )
    return None


def _op_use(op, bound: dict, via: str, value) -> _Use:
    import torch

    use = _Use(op.name, via, shape=_shape(value))
    weight = bound.get("weight")
    if op.name == "embedding" and bound.get("input") is value and isinstance(weight, torch.Tensor):
        use.vocab = int(weight.shape[0])
    elif op.name == "linear" and bound.get("input") is value and isinstance(weight, torch.Tensor):
        use.width = int(weight.shape[-1])
    elif op in _NORMS and bound.get("input") is value:
        normalized = bound.get("normalized_shape")
        if normalized:
            use.width = int(tuple(normalized)[-1])
    return use


def _refine(leaf: Leaf, use: _Use, model, sizes) -> bool:
    """Apply what `use` says to `leaf` (its shape and dtype only when not given); True
    when the leaf changed."""
    before = (leaf.kind, leaf.shape, leaf.dtype, leaf.vocab, leaf.polarity, leaf.padded)
    where = f"{_path(model, use.module)} = {_describe(use.module)}" if use.module else ""
    if use.vocab is not None:
        leaf.kind, leaf.vocab, leaf.unsure = IDS, use.vocab, False
        if not leaf.fixed:
            leaf.dtype = None
            leaf.shape = leaf.shape[:2] if len(leaf.shape) == 3 else leaf.shape
        leaf.why = where or f"F.embedding over {use.vocab} ids"
    elif use.what == "mha" and use.param in ("key_padding_mask", "attn_mask"):
        leaf.kind, leaf.padded = MASK, use.param == "key_padding_mask"
        leaf.polarity = HIDE if use.via != "arith" else KEEP
        if not leaf.fixed and use.via != "arith":
            leaf.dtype = None
            leaf.shape = use.target or leaf.shape
        leaf.why = f"{where} reads it as {use.param}"
    elif use.width is not None:
        leaf.kind, leaf.vocab, leaf.unsure = FLOAT, 0, False
        if not leaf.fixed:
            leaf.dtype = None
            leaf.shape = _fit_width(leaf, use)
        leaf.why = where or f"{use.what} takes {use.width} features"
    elif leaf.kind == MASK and use.target:
        leaf.polarity = use.polarity or KEEP
        if not leaf.fixed:
            if leaf.polarity == ADD:
                leaf.dtype = None
            elif use.subtracted and leaf.dtype in (None, "bool"):
                leaf.dtype = "int64"
            leaf.shape = _fit_mask(leaf.shape, use)
        reads = {
            "masked_fill_": "masked_fill", "where": "torch.where",
            "scaled_dot_product_attention": "SDPA's attn_mask", "add": "scores + mask",
            "mul": "a product with the mask",
        }.get(use.what, use.what)  # fmt: skip
        leaf.why = reads + (" after the forward transforms it" if use.via == "arith" else "")
    elif leaf.kind == MASK and use.subtracted and not leaf.fixed and leaf.dtype in (None, "bool"):
        leaf.dtype = "int64"
    return before != (leaf.kind, leaf.shape, leaf.dtype, leaf.vocab, leaf.polarity, leaf.padded)


def _fit_width(leaf: Leaf, use: _Use) -> tuple:
    """Activations `[batch, seq, width]` in the layout of what reads them."""
    from torch import nn

    width = use.width
    if width is None:
        raise ValueError("_fit_width: the use read no width")  # the caller checks it first
    shape = leaf.shape
    if len(shape) < 2:
        return (*shape[:-1], width) if shape else shape
    if use.what == "conv1d":
        return (shape[0], width, shape[-1]) if len(shape) == 3 else (*shape[:2], width)
    shape = (*shape[:2], width) if len(shape) == 2 else (*shape[:-1], width)
    mha = use.module if use.what == "mha" else None
    if (
        isinstance(mha, nn.MultiheadAttention)
        and not mha.batch_first
        and leaf.layout == "batch_first"
    ):
        leaf.layout = "seq_first"
        shape = (shape[1], shape[0], *shape[2:])
    return shape


def _fit_mask(shape: tuple, use: _Use) -> tuple:
    """A raw mask's shape, so that what the op got from it lines up with the scores."""
    target, got = use.target, use.shape
    if not target or not shape:
        return shape
    from .._names.axes import broadcast_shapes

    if got and broadcast_shapes(tuple(got), tuple(target)) == tuple(target):
        return shape
    if use.via == "direct" and len(shape) == 2 and len(target) == 4:
        return (target[0], 1, 1, target[-1])
    # Made into something else first (`mask[:, None, None, :]`): only the key length moves.
    return (*shape[:-1], target[-1])


def _path(model, module) -> str:
    if module is None:
        return ""
    for name, sub in model.named_modules():
        if sub is module:
            return name or type(module).__name__
    return type(module).__name__


def _describe(module) -> str:
    from torch import nn

    if isinstance(module, nn.Embedding):
        return f"nn.Embedding({module.num_embeddings}, {module.embedding_dim})"
    if isinstance(module, nn.Linear):
        return f"nn.Linear({module.in_features}, {module.out_features})"
    if isinstance(module, nn.MultiheadAttention):
        return f"nn.MultiheadAttention({module.embed_dim}, {module.num_heads})"
    return f"nn.{type(module).__name__}"


def _flat(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, tuple | list):
            yield from value
        else:
            yield value


def _out_tensors(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def _shape(value) -> tuple:
    shape = getattr(value, "shape", None)
    return tuple(int(s) for s in shape) if shape is not None else ()


def _broadcast(a, b) -> tuple | None:
    from .._names.axes import broadcast_shapes

    shapes = [_shape(x) for x in (a, b) if hasattr(x, "shape")]
    if not shapes:
        return None
    out = shapes[0]
    for shape in shapes[1:]:
        out = broadcast_shapes(out, shape) or out
    return out


def _is_bool(value) -> bool:
    return str(getattr(value, "dtype", "")) == "torch.bool"
