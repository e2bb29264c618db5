"""What the first consumer of an input says about it (token ids below an Embedding's
size, activations of a layer's width, a mask's polarity and shape), and how a leaf is
refined by it (`inputs_structure`)."""

from .. import _ops
from .inputs_structure import ADD, FLOAT, HIDE, IDS, KEEP, MASK, InputUse, Leaf

# How a mask meets scores by arithmetic (added: 0 / -inf; multiplied: 1 keeps), and the
# norms whose normalized_shape is the width of the activations they read.
_MIXES = (_ops.by_name("add"), _ops.by_name("mul"))
_NORMS = (_ops.by_name("layer_norm"), _ops.by_name("rms_norm"))


def mask_use(op, bound: dict, via: str, value, args: tuple, tracked: dict) -> InputUse | None:
    """The use of a mask by an op that applies it to scores (or features), else None."""
    name = op.name
    target, polarity = None, ""
    if name == "masked_fill" and bound.get("mask") is value:
        target, polarity = shape_of(bound.get("input")), HIDE
    elif name == "where" and bound.get("condition") is value:
        target, polarity = _broadcast(bound.get("input"), bound.get("other")), KEEP
    elif name == "scaled_dot_product_attention" and bound.get("attn_mask") is value:
        q, k = bound.get("query"), bound.get("key")
        if q is not None and k is not None:
            target = (*shape_of(q)[:-1], shape_of(k)[-2])
        polarity = KEEP if is_bool(value) else ADD
    elif op in _MIXES:
        others = [a for a in args if a is not value and hasattr(a, "shape") and a.dim() > 0]
        if others and id(others[0]) not in tracked:
            target, polarity = _broadcast(others[0], value), ADD if name == "add" else KEEP
    if target is None:
        return None
    # A mask the code transforms first is read in the common convention: 1 is a real token.
    return InputUse(name, via, shape=shape_of(value), target=tuple(target), polarity=(
        polarity if via != "arith" else KEEP
    ))  # fmt: skip


def module_use(module, param: str, via: str, value, bound: dict) -> InputUse | None:
    import torch
    from torch import nn

    shape = shape_of(value)
    if isinstance(module, nn.Embedding):
        return InputUse("module", via, module, param, shape, vocab=module.num_embeddings)
    if isinstance(module, nn.Linear):
        return InputUse("module", via, module, param, shape, width=module.in_features)
    if isinstance(module, nn.LayerNorm | nn.RMSNorm) and module.normalized_shape:
        return InputUse("module", via, module, param, shape, width=int(module.normalized_shape[-1]))
    if isinstance(module, nn.Conv1d) and param == "input":
        return InputUse("conv1d", via, module, param, shape, width=module.in_channels)
    if isinstance(module, nn.MultiheadAttention):
        if param in ("query", "key", "value"):
            width = {"query": module.embed_dim, "key": module.kdim, "value": module.vdim}[param]
            return InputUse("mha", via, module, param, shape, width=width)
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
            use = InputUse("mha", via, module, param, shape, target=target)
            return use
    layers = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder)
    if isinstance(module, layers):
        layer = module.layers[0] if isinstance(module, nn.TransformerEncoder) else module
        if param in ("src", "tgt", "memory"):
            return InputUse(
                "mha", via, layer.self_attn, "query", shape, width=layer.self_attn.embed_dim
            )
    return None


def op_use(op, bound: dict, via: str, value) -> InputUse:
    import torch

    use = InputUse(op.name, via, shape=shape_of(value))
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


def refine(leaf: Leaf, use: InputUse, model, sizes) -> bool:
    """Apply what `use` says to `leaf` (its shape and dtype only when not given); True
    when the leaf changed."""
    before = (leaf.kind, leaf.shape, leaf.dtype, leaf.vocab, leaf.polarity, leaf.padded)
    where = (
        f"{module_path(model, use.module)} = {describe_module(use.module)}" if use.module else ""
    )
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


def _fit_width(leaf: Leaf, use: InputUse) -> tuple:
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


def _fit_mask(shape: tuple, use: InputUse) -> tuple:
    """A raw mask's shape, so that what the op got from it lines up with the scores."""
    target, got = use.target, use.shape
    if not target or not shape:
        return shape
    from .._names.axes import broadcast_shapes

    if got and broadcast_shapes(tuple(got), tuple(target)) == tuple(target):
        return shape
    if use.via == "direct" and len(shape) == 2 and len(target) == 4:
        return (target[0], 1, 1, target[-1])
    # The code added axes on its way to the scores (`mask.unsqueeze(1)`): it states the rank
    # it takes, `[batch, 1, seq]` under an unsqueeze to `[batch, heads, seq_q, seq_k]`; where
    # ones do not reach, the queries' axis (`[batch, seq_q, seq_k]`).
    rank = len(target) - (len(got) - len(shape))
    if got and 2 <= rank <= len(target):
        ones = (shape[0], *([1] * (rank - 2)), target[-1])
        if shape != ones:
            return ones
        if rank >= 3:
            return (shape[0], *([1] * (rank - 3)), target[-2], target[-1])
    # Made into something else first (`mask[:, None, None, :]`): only the key length moves.
    return (*shape[:-1], target[-1])


def module_path(model, module) -> str:
    if module is None:
        return ""
    for name, sub in model.named_modules():
        if sub is module:
            return name or type(module).__name__
    return type(module).__name__


def describe_module(module) -> str:
    from torch import nn

    if isinstance(module, nn.Embedding):
        return f"nn.Embedding({module.num_embeddings}, {module.embedding_dim})"
    if isinstance(module, nn.Linear):
        return f"nn.Linear({module.in_features}, {module.out_features})"
    if isinstance(module, nn.MultiheadAttention):
        return f"nn.MultiheadAttention({module.embed_dim}, {module.num_heads})"
    return f"nn.{type(module).__name__}"


def flat_args(args: tuple, kwargs: dict):
    for value in (*args, *kwargs.values()):
        if isinstance(value, tuple | list):
            yield from value
        else:
            yield value


def out_tensors(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


def shape_of(value) -> tuple:
    shape = getattr(value, "shape", None)
    return tuple(int(s) for s in shape) if shape is not None else ()


def _broadcast(a, b) -> tuple | None:
    from .._names.axes import broadcast_shapes

    shapes = [shape_of(x) for x in (a, b) if hasattr(x, "shape")]
    if not shapes:
        return None
    out = shapes[0]
    for shape in shapes[1:]:
        out = broadcast_shapes(out, shape) or out
    return out


def is_bool(value) -> bool:
    return str(getattr(value, "dtype", "")) == "torch.bool"
