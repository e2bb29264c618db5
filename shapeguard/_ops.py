"""The op table: every torch op shapeguard knows, declared once.

An `Op` gives the names torch (2.4 and later) hands a `TorchFunctionMode` for it
(`Tensor.add`, `torch.add` and `t + u` all arrive as `add`; `2 - t` as `__rsub__`
with the tensor first), its family (which axis rule applies, see
`_names/flow/`), its parameters (so each signature is bound in one place),
and what the report and the probes need to know of it. Interception, axis
naming, checks and renderers all read this table; tests/test_ops.py pins every spelling
against `torch.overrides`. Pure Python: no torch import here.
"""

from dataclasses import dataclass

# Families: which axis rule names an op's outputs (`_names/flow/`).
QUERY = "query"  # reads a property or a size; makes no tensor: never recorded
SAME = "same"  # the output has the input's axes (casts, activations, norms, softmax)
BINARY = "binary"  # elementwise with broadcasting (add, mul, masked_fill, where, ==)
VIEW = "view"  # view, reshape, flatten, unflatten, squeeze, unsqueeze
LAYOUT = "layout"  # transpose, permute, movedim
PRODUCT = "product"  # matmul, bmm, linear, einsum: a contraction
REDUCE = "reduce"  # sum, mean, max over some axes
INDEX = "index"  # t[...], narrow, index_select, gather
JOIN = "join"  # cat, stack
PART = "part"  # split, chunk, unbind
GROW = "grow"  # expand, repeat, repeat_interleave
FACTORY = "factory"  # zeros, arange, tensor: new axes
ATTENTION = "attention"  # scaled_dot_product_attention, multi_head_attention_forward
FLASH = "flash"  # flash-attn's entry points and kernels, shapeguard.attention's wrappers
COMPOSITE = "composite"  # torch's attention modules, checked at their boundary (composites)
EMBEDDING = "embedding"  # F.embedding: token ids -> vectors
CONV = "conv"  # conv1d/2d/3d
WRITE = "write"  # t[i] = v: in place, returns nothing
OTHER = "other"  # anything this table does not list

# Steps of attention (`Op.step`): which row of the report's diagram an op feeds.
STEPS = (
    "projection",  # linear: x -> Q, K, V, and context -> out
    "heads",  # view, reshape, transpose, permute: heads split off and merged back
    "product",  # Q K^T and attn V: matmul, bmm, baddbmm, einsum
    "mask",  # masked_fill, where
    "softmax",
    "fused",  # one kernel from scores to context: SDPA, flash-attn
    "module",  # a whole attention module: multi_head_attention_forward, nn.Transformer*
)


@dataclass(frozen=True, slots=True)
class Op:
    """One op, as shapeguard knows it."""

    name: str  # the canonical name, used in messages and events
    family: str
    spellings: tuple[str, ...] = ()  # every name torch hands a mode for it
    params: tuple[str, ...] = ()  # positional parameters, the tensor first
    # The Tensor method's positional parameters, self first, where they are not `params`
    # (`x.where(cond, y)` is `torch.where(cond, x, y)`): empty when they are the same.
    method_params: tuple[str, ...] = ()
    symbol: str = ""  # how source code spells it: "@", "+", "compare"
    reflected: frozenset[str] = frozenset()  # spellings whose operands arrive swapped
    keeps_label: bool = False  # the output is the same tensor under another form
    keeps_value: bool = False  # a buffer read through it is still that buffer
    makes_mask: bool = False  # a mask through it is still the mask (`mask == 0`)
    shown: bool = False  # a row of the default trace table
    rotary: bool = False  # makes rotary tables (cos, sin)
    slices: bool = False  # takes part of a tensor along some axes
    positional: bool = False  # makes positions or a positional term (arange, cos, embedding)
    reads_table: bool = False  # indexes its first argument: a position table when that is a
    #   parameter or a buffer (t[i], index_select, embedding)
    addresses: bool = False  # reads or writes rows along `dim` by an index tensor's values,
    #   (input, dim, index, ...): how a graph's message passing reaches its nodes
    aliases: bool = False  # a view in torch's sense: the output shares the input's storage
    #   (reshape and flatten, which copy when they must, are not)
    step: str = ""  # the step of attention it computes, as the report's diagram draws it
    reads_values: bool = False  # a query that reads the tensor's values, not only its
    #   metadata (item, tolist, __bool__: what a recorded step must remember, `_trace.replay`)
    # flash-attn: how q, k, v arrive ("dense", "qkvpacked", "kvpacked", "varlen",
    # "varlen_qkvpacked", "varlen_kvpacked", "xformers") and whose entry point it is ("flash_attn",
    # "kernel": a torch.ops.flash_attn op, "shapeguard": shapeguard.attention's, "torch":
    # torch.nn.attention.varlen's, "xformers": memory_efficient_attention, wrapped as FLEX).
    flash_form: str = ""
    flash_entry: str = ""
    # A layer torch's SequenceParallel style runs on this rank's slice of seq (norms,
    # dropout): the op that first reads the DTensor its plan declares (`tp_shard_replicated`).
    sequence_parallel: bool = False


_TABLE: dict[str, Op] = {}
ALL: list[Op] = []


def _op(name: str, family: str, *more: str, **options) -> Op:
    """Declare an op; `more` lists the other spellings torch uses for it."""
    spellings = (name, *more)
    op = Op(name, family, spellings, **options)
    if op.step and op.step not in STEPS:
        raise RuntimeError(f"op table: {name!r} has step {op.step!r}, not one of {STEPS}")
    # Every spelling is checked before any is added, so a refused declaration leaves
    # the table as it was.
    for k, spelling in enumerate(spellings):
        if spelling in _TABLE or spelling in spellings[:k]:
            raise RuntimeError(f"op table: {spelling!r} is declared twice")
    for spelling in spellings:
        _TABLE[spelling] = op
    ALL.append(op)
    return op


def _ops(family: str, names: str, **options) -> None:
    for name in names.split():
        _op(name, family, **options)


# -- queries: passed straight through, never recorded ---------------------------------
# fmt: off
_ops(QUERY, """
    size dim stride numel is_contiguous element_size __len__ is_floating_point is_complex
    nelement _set_grad_enabled storage_offset get_device shape dtype device ndim
    requires_grad is_nested is_cuda is_cpu is_meta grad_fn grad layout is_sparse
    is_quantized names _version is_leaf output_nr _base is_mkldnn is_mps is_xpu itemsize
    nbytes is_inference _is_view is_signed __dlpack_device__ is_pinned
""")
_ops(QUERY, """
    data_ptr __bool__ item tolist __format__ __repr__ __index__ __int__ __float__ __hash__
    untyped_storage __reduce_ex__ data __deepcopy__ __setstate__ __array__ numpy __dlpack__
    _typed_storage storage
""", reads_values=True)
# fmt: on

# -- shape-preserving ops -----------------------------------------------------------------
_CASTS = "float half bfloat16 double long int short bool byte char type_as to type cpu cuda"
for _name in _CASTS.split():
    _op(_name, SAME, keeps_label=True, keeps_value=True, makes_mask=_name == "bool")
for _name in ["contiguous", "clone", "requires_grad_"]:
    _op(_name, SAME, keeps_label=True, keeps_value=True)
_op("cumsum", SAME, keeps_label=True)  # new values: a buffer summed is no longer that buffer
_op("detach", SAME, "detach_", keeps_label=True, keeps_value=True, aliases=True)
# fmt: off
_ops(SAME, """
    relu relu_ gelu silu silu_ tanh sigmoid exp log log1p neg abs sqrt rsqrt reciprocal sign
    erf clamp clamp_ clip nan_to_num fill_ zero_ square sin_ cos_ dropout_ alpha_dropout
    feature_alpha_dropout gelu_ elu leaky_relu mish softplus hardswish hardtanh celu selu
    glu normalize group_norm batch_norm instance_norm local_response_norm round floor ceil
    trunc frac triu tril triu_ tril_ flip roll fliplr flipud cumprod exp_ uniform_ normal_
    bernoulli_ isinf isnan isfinite isneginf isposinf signbit sgn angle conj
""", keeps_label=True)
# fmt: on
_ops(SAME, "real imag", keeps_label=True, aliases=True)
_op(
    "dropout", SAME, "dropout1d", "dropout2d", "dropout3d", keeps_label=True, sequence_parallel=True
)
_op(
    "softmax",
    SAME,
    "_softmax",
    params=("input", "dim"),
    keeps_label=True,
    shown=True,
    step="softmax",
)
_op("log_softmax", SAME, params=("input", "dim"), keeps_label=True)
_op(
    "layer_norm",
    SAME,
    params=("input", "normalized_shape", "weight", "bias"),
    keeps_label=True,
    sequence_parallel=True,
)
_op(
    "rms_norm",
    SAME,
    params=("input", "normalized_shape", "weight", "eps"),
    keeps_label=True,
    sequence_parallel=True,
)
_op("cos", SAME, rotary=True, positional=True)
_op("sin", SAME, rotary=True, positional=True)
_op("logical_not", SAME, "bitwise_not", "__invert__", makes_mask=True, keeps_value=True)

# -- elementwise with broadcasting --------------------------------------------------------
_op("add", BINARY, "add_", "__add__", "__radd__", "__iadd__", symbol="+", keeps_label=True)
_op("sub", BINARY, "sub_", "__sub__", "__isub__", symbol="-", keeps_label=True, keeps_value=True)
_op(
    "__rsub__",
    BINARY,
    "rsub",
    symbol="-",
    reflected=frozenset({"__rsub__", "rsub"}),
    keeps_value=True,
)
_op(
    "mul",
    BINARY,
    "mul_",
    "__mul__",
    "__rmul__",
    "__imul__",
    "multiply",
    symbol="*",
    keeps_label=True,
    keeps_value=True,
)
_op(
    "div",
    BINARY,
    "div_",
    "__truediv__",
    "__itruediv__",
    "__idiv__",
    "true_divide",
    "divide",
    symbol="/",
    keeps_label=True,
)
_op(
    "__rdiv__",
    BINARY,
    "__rtruediv__",
    symbol="/",
    reflected=frozenset({"__rdiv__", "__rtruediv__"}),
)
_op("pow", BINARY, "pow_", "__pow__", "__ipow__", symbol="**", keeps_label=True)
_op("__rpow__", BINARY, symbol="**", reflected=frozenset({"__rpow__"}))
_op("__floordiv__", BINARY, "floor_divide", "__rfloordiv__", "__ifloordiv__", symbol="//")
_op("remainder", BINARY, "__mod__", "__rmod__", "fmod", symbol="%")
_op("eq", BINARY, "__eq__", "eq_", symbol="compare", makes_mask=True, keeps_value=True)
_op("ne", BINARY, "__ne__", "ne_", "not_equal", symbol="compare", makes_mask=True, keeps_value=True)
for _name, _dunder in (("lt", "__lt__"), ("le", "__le__"), ("gt", "__gt__"), ("ge", "__ge__")):
    _op(_name, BINARY, _dunder, symbol="compare", makes_mask=True)
_op(
    "logical_and",
    BINARY,
    "__and__",
    "bitwise_and",
    "__iand__",
    "__rand__",
    makes_mask=True,
    keeps_value=True,
)
_op(
    "logical_or",
    BINARY,
    "__or__",
    "bitwise_or",
    "__ior__",
    "__ror__",
    makes_mask=True,
    keeps_value=True,
)
_op("logical_xor", BINARY, "__xor__", "bitwise_xor", "__ixor__", "__rxor__", makes_mask=True)
_op("maximum", BINARY, "minimum", "fmax", "fmin", "atan2", "hypot", "copysign")
_op(
    "masked_fill",
    BINARY,
    "masked_fill_",
    params=("input", "mask", "value"),
    keeps_label=True,
    keeps_value=True,
    shown=True,
    step="mask",
)
_op(
    "where",
    BINARY,
    params=("condition", "input", "other"),
    method_params=("input", "condition", "other"),
    keeps_label=True,
    keeps_value=True,
    shown=True,
    step="mask",
)
_op("lerp", BINARY, "addcmul", "addcdiv", "copy_")

# -- views and layouts --------------------------------------------------------------------
_op("view", VIEW, keeps_value=True, aliases=True, step="heads")
_op("reshape", VIEW, keeps_value=True, step="heads")
_op("view_as", VIEW, aliases=True)
_op("reshape_as", VIEW)  # a copy when it must, as reshape
_op("flatten", VIEW, params=("input", "start_dim", "end_dim"))
_op("unflatten", VIEW, params=("input", "dim", "sizes"), aliases=True)
_op("squeeze", VIEW, "squeeze_", params=("input", "dim"), keeps_value=True, aliases=True)
_op("unsqueeze", VIEW, "unsqueeze_", params=("input", "dim"), keeps_value=True, aliases=True)
_op(
    "transpose",
    LAYOUT,
    "transpose_",
    "swapaxes",
    "swapdims",
    params=("input", "dim0", "dim1"),
    keeps_label=True,
    aliases=True,
    step="heads",
)
_op("permute", LAYOUT, keeps_label=True, aliases=True, step="heads")
_op(
    "movedim",
    LAYOUT,
    "moveaxis",
    params=("input", "source", "destination"),
    keeps_label=True,
    aliases=True,
)
# t/T reverse the axes (swap them when there are two); mT/mH swap the last two of any rank.
_op("t", LAYOUT, "t_", "T", "H", keeps_label=True, aliases=True)
_op("mT", LAYOUT, "mH", "adjoint", keeps_label=True, aliases=True)
_op("as_strided", OTHER, aliases=True)  # no axis rule: its strides say nothing of axes

# -- contractions --------------------------------------------------------------------------
_op(
    "matmul",
    PRODUCT,
    "__matmul__",
    "__rmatmul__",
    symbol="@",
    reflected=frozenset({"__rmatmul__"}),
    shown=True,
    step="product",
)
_op("bmm", PRODUCT, shown=True, step="product")
_op("mm", PRODUCT, shown=True)
_op("mv", PRODUCT, "dot", "vdot", "inner")
_op("baddbmm", PRODUCT, params=("input", "batch1", "batch2"), shown=True, step="product")
_op("addmm", PRODUCT, "addbmm", params=("input", "mat1", "mat2"))
_op("linear", PRODUCT, params=("input", "weight", "bias"), step="projection")
_op("einsum", PRODUCT, shown=True, step="product")
_op("outer", PRODUCT, "ger")

# -- reductions, indexing, joins, parts, growth ---------------------------------------------
# fmt: off
_ops(REDUCE, """
    sum mean amax amin max min std var norm all any argmax argmin logsumexp prod nansum
    nanmean median count_nonzero std_mean var_mean aminmax topk sort argsort cummax cummin
""", params=("input", "dim", "keepdim"))
# fmt: on
# Basic indexing (t[i], t[:, :k]) is a view; advanced indexing (t[idx]) copies, but tells
# no more of aliasing from its name than this.
_op("__getitem__", INDEX, keeps_value=True, slices=True, reads_table=True, aliases=True)
_op(
    "narrow",
    INDEX,
    params=("input", "dim", "start", "length"),
    keeps_value=True,
    slices=True,
    reads_table=True,
    aliases=True,
)
_op("select", INDEX, params=("input", "dim", "index"), keeps_value=True, slices=True, aliases=True)
_op("index_select", INDEX, params=("input", "dim", "index"), reads_table=True, addresses=True)
_op(
    "gather",
    INDEX,
    "take_along_dim",
    params=("input", "dim", "index"),
    reads_table=True,
    addresses=True,
)
# Writes of rows by an index (the output is the input's shape; no rule reads them yet).
for _name in ("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy"):
    _op(_name, OTHER, f"{_name}_", params=("input", "dim", "index", "src"), addresses=True)
_op("masked_select", INDEX, "nonzero", "take", "argwhere")
_op("cat", JOIN, "concat", "concatenate", params=("tensors", "dim"))
_op("stack", JOIN, params=("tensors", "dim"))
_op(
    "split",
    PART,
    "split_with_sizes",
    params=("tensor", "split_size_or_sections", "dim"),
    aliases=True,
)
_op("chunk", PART, params=("input", "chunks", "dim"), aliases=True)
_op("tensor_split", PART, params=("input", "indices_or_sections", "dim"), aliases=True)
_op("unbind", PART, params=("input", "dim"), aliases=True)
_op("expand", GROW, "expand_as", "broadcast_to", keeps_value=True, aliases=True)
_op("repeat", GROW, "tile")
_op("repeat_interleave", GROW, params=("input", "repeats", "dim"))
_op("pad", GROW, params=("input", "pad", "mode", "value"))  # F.pad: the last axes grow

# -- new tensors ---------------------------------------------------------------------------
# fmt: off
_ops(FACTORY, """
    tensor as_tensor zeros ones empty full randn rand randint eye linspace logspace
    zeros_like ones_like empty_like full_like rand_like randn_like randint_like new_zeros
    new_ones new_empty new_full new_tensor tril_indices triu_indices empty_strided scalar_tensor
    randperm normal complex one_hot bucketize searchsorted
""")
# fmt: on
_op("arange", FACTORY, positional=True)
_op("polar", FACTORY, rotary=True, positional=True)  # torch.polar(ones, angles): a rotary table
_op("view_as_complex", VIEW, keeps_label=True, aliases=True, positional=True)
_op("view_as_real", VIEW, keeps_label=True, aliases=True)
# F.unfold (im2col); Tensor.unfold (a sliding window) shares the name: the rule tells them apart.
_op("unfold", CONV, params=("input", "kernel_size", "dilation", "padding", "stride"))

# -- attention, embeddings, convolutions ------------------------------------------------------
SDPA = _op(
    "scaled_dot_product_attention",
    ATTENTION,
    params=("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
    shown=True,
    step="fused",
)
MHA = _op(
    "multi_head_attention_forward",
    ATTENTION,
    params=(
        "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight",
        "in_proj_bias", "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight",
        "out_proj_bias", "training", "key_padding_mask", "need_weights", "attn_mask",
        "use_separate_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
        "static_k", "static_v", "average_attn_weights", "is_causal",
    ),
    shown=True,
    step="module",
)  # fmt: skip
# torch's FlexAttention, a Python function over a higher-order op that runs compiled (no
# mode sees it): wrapped while a trace is open (`_trace/torch_entries.py`), as flash-attn's.
FLEX = _op(
    "flex_attention",
    ATTENTION,
    params=(
        "query", "key", "value", "score_mod", "block_mask", "scale", "enable_gqa",
        "return_lse", "kernel_options",
    ),
    shown=True,
    step="fused",
)  # fmt: skip
# flash-attn: its Python entry points (wrapped while a trace is open), its torch.ops
# kernels, and shapeguard.attention's own entry points. All take [batch, seq, heads, d_k].
_FLASH_FORMS = {
    "flash_attn_func": "dense",
    "flash_attn_kvpacked_func": "kvpacked",
    "flash_attn_qkvpacked_func": "qkvpacked",
    "flash_attn_varlen_func": "varlen",
    "flash_attn_varlen_kvpacked_func": "varlen_kvpacked",
    "flash_attn_varlen_qkvpacked_func": "varlen_qkvpacked",
}
FLASH_ENTRY_POINTS = tuple(_FLASH_FORMS)
for _name, _form in _FLASH_FORMS.items():
    _op(_name, FLASH, shown=True, step="fused", flash_form=_form, flash_entry="flash_attn")
_op(
    "flash_attention", FLASH, shown=True, step="fused", flash_form="dense", flash_entry="shapeguard"
)
_op(
    "flash_attention_varlen",
    FLASH,
    params=(
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
    ),
    shown=True,
    step="fused",
    flash_form="varlen",
    flash_entry="shapeguard",
)  # fmt: skip
_op(
    "_flash_attn_forward",
    FLASH,
    "_flash_attn_forward.default",
    params=(
        "q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size_left",
        "window_size_right", "softcap", "alibi_slopes", "return_softmax",
    ),
    shown=True,
    step="fused",
    flash_form="dense",
    flash_entry="kernel",
)  # fmt: skip
_op(
    "_flash_attn_varlen_forward",
    FLASH,
    "_flash_attn_varlen_forward.default",
    params=(
        "q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
        "dropout_p", "softmax_scale", "causal", "window_size_left", "window_size_right",
        "softcap", "alibi_slopes", "return_softmax", "block_table", "leftpad_k", "seqused_k",
    ),
    shown=True,
    step="fused",
    flash_form="varlen",
    flash_entry="kernel",
)  # fmt: skip
# torch.nn.attention.varlen's packed attention [total, heads, d_k] (wrapped, as FLEX).
VARLEN = _op(
    "varlen_attn",
    FLASH,
    params=("query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"),
    shown=True,
    step="fused",
    flash_form="varlen",
    flash_entry="torch",
)
XFORMERS = _op("memory_efficient_attention", FLASH, params=("query", "key", "value", "attn_bias"),
               shown=True, step="fused", flash_form="xformers", flash_entry="xformers")  # fmt: skip
# torch's attention modules, recorded as one call each: their fused fast paths run unseen.
COMPOSITES = (
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerEncoder",
    "TransformerDecoderLayer",
    "TransformerDecoder",
    "Transformer",
)
for _name in COMPOSITES:
    _op(_name, COMPOSITE, shown=True, step="module")
_op("embedding", EMBEDDING, params=("input", "weight", "padding_idx"), positional=True,
    reads_table=True)  # fmt: skip
_op("conv1d", CONV, "conv2d", "conv3d", params=("input", "weight", "bias", "stride", "padding"))
# Pooling reads [batch, channels, *spatial] as a conv does, with no weight (the conv rule).
_ops(CONV, """
    avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d max_pool2d_with_indices
    lp_pool1d lp_pool2d lp_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d
    adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d
""")  # fmt: skip
_op("__setitem__", WRITE)


# Not a memo: one Op per spelling, compared by identity (callers keep them), and the
# spellings are torch's function names, a set bounded by torch itself.
_OTHERS: dict[str, Op] = {}


def lookup(spelling: str) -> Op:
    """The op for a spelling; an op of family OTHER (made once per name) if unlisted."""
    op = _TABLE.get(spelling)
    if op is None:
        op = _OTHERS.get(spelling)
        if op is None:
            op = _OTHERS[spelling] = Op(spelling, OTHER, (spelling,))
    return op


def name_of(func) -> str:
    """The spelling torch hands a mode: `__name__`, and a property's own name for its
    `__get__` (`t.T` arrives as `T.__get__`)."""
    name = getattr(func, "__name__", None) or repr(func)
    if name == "__get__":
        owner = getattr(func, "__self__", None)
        return getattr(owner, "__name__", name)
    return name


def is_inplace(spelling: str) -> bool:
    """`add_`, `__iadd__`: the op writes into its first operand."""
    return (spelling.endswith("_") and not spelling.endswith("__")) or spelling.startswith("__i")


def op_for(func) -> Op:
    return lookup(name_of(func))


def spellings() -> dict[str, Op]:
    """Every declared spelling and its op (a copy)."""
    return dict(_TABLE)


def declared(spelling: str) -> Op | None:
    """The op declared for a spelling, None when the table does not list it (unlike
    `lookup`, which makes an op of family OTHER)."""
    return _TABLE.get(spelling)


def bind(op: Op, args: tuple, kwargs: dict, method: bool = False) -> dict:
    """The op's arguments by parameter name (positional first, keywords over them);
    `method`: called as a Tensor method, self first (`Op.method_params`)."""
    params = op.method_params if method and op.method_params else op.params
    bound = dict(zip(params, args, strict=False))
    if kwargs:
        bound.update(kwargs)
    return bound


def by_name(name: str) -> Op:
    """The op declared under the canonical `name` (KeyError for a name never declared)."""
    op = _TABLE[name]
    if op.name != name:
        raise KeyError(name)
    return op


def family_ops(*families: str) -> frozenset[str]:
    """Every spelling of the ops of these families."""
    return frozenset(s for op in ALL if op.family in families for s in op.spellings)


def shown_ops() -> frozenset[str]:
    """Every spelling of the ops the trace table shows even when no role names them
    (events carry the spelling torch gave: `masked_fill_`, `__rmatmul__`)."""
    return spellings_where(shown=True)


def spellings_where(**attributes) -> frozenset[str]:
    """Every spelling of the ops whose attributes have these values
    (`spellings_where(step="fused")`, `spellings_where(positional=True)`)."""
    for attribute in attributes:
        if attribute not in Op.__dataclass_fields__:
            raise AttributeError(f"Op has no attribute {attribute!r}")
    return frozenset(
        s
        for op in ALL
        if all(getattr(op, k) == v for k, v in attributes.items())
        for s in op.spellings
    )
