"""`shapeguard explain`'s rules for flash-attn's messages (its C++ checks print no sizes),
and for Python's when flash_attn cannot be imported."""

import re

from .._errors import Operand
from .rules import Explanation, Rules

RULES = Rules()

_FLASH_LAYOUT = (
    "flash-attn wants q [batch, seqlen_q, nheads, headdim] and k, v [batch, seqlen_k, nheads_k, "
    "headdim], fp16 or bf16, on CUDA"
)
_FLASH_SHAPE_NOTES = {
    "q": "the query: [batch, seqlen_q, nheads, headdim]",
    "k": "the keys: [batch, seqlen_k, nheads_k, headdim], same batch and headdim as q",
    "v": "the values: same shape as k",
    "out": "the output buffer: the shape of q",
    "cu_seqlens_q": "varlen: int32 cumulative query lengths [0, len_0, len_0+len_1, ...], batch + 1 entries",
    "cu_seqlens_k": "varlen: int32 cumulative key lengths, batch + 1 entries",
    "seqlens_k": "per-sequence key lengths in the KV cache, batch entries",
    "block_table": "paged KV cache: [batch, max_num_blocks_per_seq]",
    "alibi_slopes": "[nheads] or [batch, nheads], float32",
}

RULES.fixed(
    r"cannot import name 'flash_attention' from 'flash_attn'[^\n]*",
    "flash_import",
    "flash_attn has no function named flash_attention",
    "the import is `from flash_attn import flash_attn_func`; call "
    "flash_attn_func(q, k, v, causal=...) with q, k, v as [batch, seq, heads, head_dim] "
    "fp16/bf16 CUDA tensors (from [batch, heads, seq, head_dim] use .transpose(1, 2)); "
    "shapeguard.attention.flash_attention checks that contract and falls back to SDPA off the GPU",
)
RULES.fixed(
    r"No module named 'flash_attn[\w.]*'",
    "flash_missing",
    "flash-attn is not installed (or its CUDA extension did not build)",
    "it needs an NVIDIA GPU (Ampere or newer) and CUDA: pip install flash-attn --no-build-isolation; "
    "without one, F.scaled_dot_product_attention computes the same attention on "
    "[batch, heads, seq, head_dim] tensors",
)


@RULES.rule(r"\b(\w+) must have shape \(([^()]*)\)")
def _flash_shape(m: re.Match) -> Explanation:
    name, dims = m.group(1), m.group(2)
    note = _FLASH_SHAPE_NOTES.get(name, "see the flash-attn docstring of the function you called")
    layout_hint = ""
    if name in ("q", "k", "v", "out"):
        layout_hint = (
            "a [batch, heads, seq, head_dim] tensor (the layout SDPA and most tutorials use) must be "
            "transposed: q.transpose(1, 2); k and v must agree with each other and with q on batch and "
            "head_dim; "
        )
    return Explanation(
        "flash_shape",
        m.group(0),
        f"flash-attn: {name} must be ({dims}); its message prints no sizes",
        (Operand(name, note),),
        layout_hint + f"{_FLASH_LAYOUT}; print q.shape, k.shape, v.shape to see which axis is off",
    )


RULES.fixed(
    r"FlashAttention only supports? fp16 and bf16 data type",
    "flash_dtype",
    "flash-attn: q, k and v must be float16 or bfloat16",
    "cast with q.to(torch.bfloat16) (and k, v), or run under torch.autocast('cuda', "
    "dtype=torch.bfloat16); a LayerNorm/RMSNorm kept in float32 often upcasts the tensor before "
    "attention",
)
RULES.fixed(
    r"query and (key|value) must have the same dtype",
    "flash_dtype_mismatch",
    "flash-attn: the query and the {0} have different dtypes",
    "cast all three to one of float16 / bfloat16 (a KV cache kept in another dtype is the usual cause)",
)
RULES.fixed(
    r"\b(\w+) must be on CUDA",
    "flash_device",
    "flash-attn: {0} is not on a CUDA device",
    "move q, k, v to the GPU (.cuda()); on CPU use F.scaled_dot_product_attention with "
    "[batch, heads, seq, head_dim] tensors",
)
RULES.fixed(
    r"Input tensor must have contiguous last dimension",
    "flash_contiguous",
    "flash-attn: the last axis (head_dim) of q, k or v is strided",
    "call .contiguous() on the tensor after the permute or slice that moved head_dim "
    "(a transpose(1, 2) alone keeps head_dim contiguous)",
)
RULES.fixed(
    r"FlashAttention forward only supports head dimension at most (\d+)",
    "flash_head_dim",
    "flash-attn: head_dim is larger than {0}",
    "check that the last axis is head_dim (d_model // n_heads), not d_model or a sequence length "
    "from a layout mix-up; otherwise use more heads or SDPA",
    ("q", "[batch, seqlen_q, nheads, headdim]  headdim is the last axis"),
)
RULES.fixed(
    r"Number of heads in key/value must divide number of heads in query",
    "flash_gqa_heads",
    "flash-attn: nheads (q) % nheads_k (k, v) != 0",
    "the heads are axis 2 in flash-attn's layout: a [batch, heads, seq, head_dim] tensor puts the "
    "sequence length there (transpose(1, 2)); otherwise n_kv_heads must divide n_heads",
    ("q", "[batch, seqlen_q, nheads, headdim]"),
    ("k", "[batch, seqlen_k, nheads_k, headdim]"),
)
RULES.fixed(
    r"FlashAttention only supports Ampere GPUs or newer\.?",
    "flash_gpu",
    "flash-attn 2 runs on Ampere (sm80) or newer GPUs only",
    "on older GPUs or CPU use F.scaled_dot_product_attention (its memory-efficient kernel runs "
    "on older GPUs), with [batch, heads, seq, head_dim] tensors",
)
