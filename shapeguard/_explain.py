"""`shapeguard explain`: the common PyTorch (and flash-attn) shape errors, in attention terms.

Each rule matches one message family and says what it means for attention code
(which tensor is which, what the numbers are, which sizes were flattened
together) and the likely fix, in the house message format. Pure Python: no torch.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import Operand, format_message


@dataclass(frozen=True, slots=True)
class Explanation:
    """One recognized error message and what it means."""

    kind: str
    matched: str  # the error text as torch (or flash-attn, or Python) wrote it
    relation: str
    operands: tuple[Operand, ...] = ()
    hint: str = ""

    def render(self) -> str:
        return format_message(
            self.relation,
            source=f"torch said: {self.matched}",
            operands=self.operands,
            hint=self.hint,
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "matched": self.matched,
            "relation": self.relation,
            "operands": [{"name": o.name, "shape": o.shape} for o in self.operands],
            "hint": self.hint,
        }


Builder = Callable[[re.Match], Explanation]
_RULES: list[tuple[re.Pattern[str], Builder]] = []


def _rule(pattern: str):
    def register(builder: Builder) -> Builder:
        _RULES.append((re.compile(pattern), builder))
        return builder

    return register


def explain(text: str) -> list[Explanation]:
    """Every recognized error message in `text` (a message or a whole traceback), in order.

    >>> [e.kind for e in explain("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x5 and 6x7)")]
    ['linear_in_features']
    >>> explain("KeyError: 'foo'")
    []
    """
    found: list[tuple[int, int, Explanation]] = []
    for pattern, builder in _RULES:
        for match in pattern.finditer(text):
            found.append((match.start(), match.end(), builder(match)))
    found.sort(key=lambda item: (item[0], -item[1]))
    out: list[Explanation] = []
    seen: set[str] = set()
    end = -1
    for start, stop, explanation in found:
        # Overlapping matches are one message read by two rules: keep the longest.
        if start < end or explanation.matched in seen:
            continue
        seen.add(explanation.matched)
        out.append(explanation)
        end = stop
    return out


# -- helpers ---------------------------------------------------------------------------------


def factor_pairs(n: int, limit: int = 4) -> str:
    """Plausible `batch x seq` splits of `n` flattened rows: `1x64, 2x32, 4x16, 8x8`.

    >>> factor_pairs(64)
    '1x64, 2x32, 4x16, 8x8'
    >>> factor_pairs(7)
    '1x7'
    """
    pairs = [f"{b}x{n // b}" for b in range(1, int(n**0.5) + 1) if n % b == 0]
    return ", ".join(pairs[:limit] if len(pairs) <= limit else [*pairs[: limit - 1], pairs[-1]])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _prime_factors(n: int) -> str:
    out, d, m = [], 2, n
    while d * d <= m:
        while m % d == 0:
            out.append(d)
            m //= d
        d += 1
    if m > 1:
        out.append(m)
    return " x ".join(map(str, out)) if out else str(n)


def _ints(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"-?\d+", text)]


_SCORES_AXES = ("batch", "heads", "seq_q", "seq_k")


# -- Linear / mm -----------------------------------------------------------------------------


@_rule(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
def _linear(m: re.Match) -> Explanation:
    rows, features, in_features, out_features = (int(g) for g in m.groups())
    hints = [f"the Linear that fits this input is nn.Linear({features}, {out_features})"]
    if in_features % features == 0 and in_features != features:
        heads = in_features // features
        hints.append(
            f"{in_features} = {heads} x {features}: the input may still be one head's d_k={features}; "
            f"merge the {heads} heads back first: x.transpose(1, 2).reshape(batch, seq, {in_features})"
        )
    elif features % in_features == 0 and features != in_features:
        hints.append(
            f"{features} = {features // in_features} x {in_features}: the input has "
            f"{features // in_features} times the features the layer takes (heads merged twice, or "
            "the wrong tensor was concatenated)"
        )
    hints.append(
        f"or keep the layer and feed it {in_features} features: check the layer before it and any "
        "view/transpose that left the wrong axis last"
    )
    return Explanation(
        "linear_in_features",
        m.group(0),
        f"a Linear layer got inputs with {features} features, but its weight takes "
        f"in_features={in_features}",
        (
            Operand(
                "mat1",
                f"[rows={rows}, features={features}]  the input with all leading axes flattened: "
                f"{rows} rows = batch x seq ({factor_pairs(rows)}); {features} is its last axis",
            ),
            Operand(
                "mat2",
                f"[in_features={in_features}, out_features={out_features}]  the Linear's weight, "
                f"transposed: nn.Linear({in_features}, {out_features}) (for torch.mm(a, b): b itself)",
            ),
        ),
        "; ".join(hints),
    )


# -- bmm / matmul with batch axes --------------------------------------------------------------


@_rule(
    r"Expected size for first two dimensions of batch2 tensor to be: "
    r"\[(\d+), (\d+)\] but got: \[(\d+), (\d+)\]\.?"
)
def _bmm(m: re.Match) -> Explanation:
    batch, inner, got_batch, got_inner = (int(g) for g in m.groups())
    operands = (
        Operand(
            "batch1",
            f"[{batch}, rows, {inner}]  the left operand (Q, or attn), batch and heads flattened "
            f"together: {batch} = batch x heads ({factor_pairs(batch)})",
        ),
        Operand(
            "batch2",
            f"[{got_batch}, {got_inner}, cols]  the right operand (K^T, or V); it should be "
            f"[{batch}, {inner}, cols]",
        ),
    )
    if batch == got_batch:
        return Explanation(
            "bmm_inner",
            m.group(0),
            f"batched matmul: the left operand's last axis ({inner}) != the right operand's "
            f"second-to-last axis ({got_inner})",
            operands,
            f"for scores = Q @ K^T, {inner} is Q's d_k and {got_inner} is what K^T has there: if "
            f"{got_inner} is a sequence length, K was not transposed (use K.transpose(-2, -1)); if it "
            "is another head size, Q and K were projected or split differently. For attn @ V, "
            f"{inner} is attn's seq_k and {got_inner} V's seq: keys and values must have the same length",
        )
    return Explanation(
        "bmm_batch",
        m.group(0),
        f"batched matmul: the batch axes differ: {batch} != {got_batch} "
        "(batch and heads flattened together)",
        operands,
        f"{batch} = batch x heads ({factor_pairs(batch)}) and {got_batch} ({factor_pairs(got_batch)}): "
        "compare batch and heads of the two operands; K/V with fewer heads than Q (GQA) need "
        "repeat_interleave over the heads axis, or F.scaled_dot_product_attention(..., enable_gqa=True)",
    )


@_rule(r"(batch[12]) must be a 3D tensor")
def _bmm_rank(m: re.Match) -> Explanation:
    return Explanation(
        "bmm_rank",
        m.group(0),
        f"torch.bmm takes 3-D tensors [batch, rows, cols]; {m.group(1)} has another number of axes",
        (),
        "for [batch, heads, seq, d_k] tensors use torch.matmul (or @), which broadcasts over both "
        "leading axes; or flatten them first: x.reshape(batch * heads, seq, d_k)",
    )


# -- broadcasting ----------------------------------------------------------------------------


@_rule(
    r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton dimension (\d+)"
)
def _broadcast(m: re.Match) -> Explanation:
    a, b, dim = (int(g) for g in m.groups())
    axis = _SCORES_AXES[dim] if dim < len(_SCORES_AXES) else None
    where = (
        f"; if the result is 4-D scores [batch, heads, seq_q, seq_k], that axis is {axis}"
        if axis
        else ""
    )
    return Explanation(
        "broadcast",
        m.group(0),
        f"elementwise op: sizes {a} and {b} do not broadcast at dimension {dim} of the result{where}",
        (
            Operand(
                "a",
                f"size {a} at dimension {dim}  the first operand (scores in scores + mask; "
                "self in x.masked_fill(mask, ...))",
            ),
            Operand("b", f"size {b} at dimension {dim}  the second operand (the mask or bias)"),
        ),
        "shapes line up from the right, so a [batch, seq_k] padding mask against scores "
        "[batch, heads, seq_q, seq_k] puts batch on seq_q: reshape it to [batch, 1, 1, seq_k] with "
        "mask[:, None, None, :]; a [batch, seq_q, seq_k] mask needs mask.unsqueeze(1) for the heads "
        "axis; otherwise two sequence lengths (or batch sizes) differ",
    )


# -- view / reshape --------------------------------------------------------------------------


@_rule(r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)")
def _view_size(m: re.Match) -> Explanation:
    target = _ints(m.group(1))
    numel = int(m.group(2))
    known = 1
    for s in target:
        if s != -1:
            known *= s
    operands = [
        Operand("input", f"{numel} elements = {_prime_factors(numel)}"),
        Operand(
            "target",
            f"[{m.group(1)}] asks for "
            + (
                f"{known} x (-1), and {numel} / {known} is not whole"
                if -1 in target
                else f"{known} elements"
            ),
        ),
    ]
    relation = (
        f"view/reshape: the target shape [{m.group(1)}] cannot hold the input's {numel} elements"
    )
    hint = (
        "view only regroups the same elements: the product of the new sizes must equal the old one"
    )
    if (
        len(target) == 4
        and target[0] > 0
        and target[1] > 0
        and numel % (target[0] * target[1]) == 0
    ):
        d_model = numel // (target[0] * target[1])
        heads, d_k = target[2], target[3]
        if d_k == -1 and heads > 0:
            fits = ", ".join(map(str, [d for d in _divisors(d_model) if d > 1][:8]))
            hint = (
                f"splitting heads: [batch={target[0]}, seq={target[1]}, heads={heads}, d_k=-1] of an input "
                f"with d_model={d_model} features per token; {d_model} is not divisible by {heads} heads "
                f"(head counts that divide {d_model}: {fits})"
            )
        elif heads > 0 and d_k > 0:
            hint = (
                f"splitting heads: heads x d_k = {heads} x {d_k} = {heads * d_k}, but the input has "
                f"d_model={d_model} features per token; use d_k = d_model // heads"
                + (
                    f" = {d_model // heads}"
                    if d_model % heads == 0
                    else f" (and {heads} does not divide {d_model})"
                )
            )
    elif len(target) == 4 and target[0] > 0 and target[1] == -1 and target[2] > 0 and target[3] > 0:
        hint = (
            f"splitting heads with seq=-1: each token must have heads x d_k = {target[2] * target[3]} "
            f"features, and {numel} / {target[0]} = {numel / target[0]:g} per batch element is not a "
            "multiple of it; check d_model against n_heads * d_k"
        )
    elif len(target) == 3 and target[0] > 0 and target[2] > 0 and -1 in target[1:2]:
        hint = (
            f"merging heads back: [batch={target[0]}, seq=-1, d_model={target[2]}] needs a multiple of "
            f"{target[0] * target[2]} elements; the input has {numel}: the heads or d_k it came from "
            f"differ from d_model={target[2]}"
        )
    return Explanation("view_size", m.group(0), relation, tuple(operands), hint)


@_rule(r"view size is not compatible with input tensor's size and stride[^\n]*")
def _view_stride(m: re.Match) -> Explanation:
    return Explanation(
        "noncontiguous_view",
        m.group(0),
        "view cannot merge axes of a non-contiguous tensor (typically context after .transpose(1, 2))",
        (
            Operand(
                "input",
                "a transposed view, e.g. context [batch, seq, heads, d_k] made by "
                "transpose(1, 2) of [batch, heads, seq, d_k]",
            ),
        ),
        "merge heads with context.transpose(1, 2).contiguous().view(batch, seq, d_model), or use "
        ".reshape(...), which copies when it must",
    )


@_rule(
    r"Dimension out of range \(expected to be in range of \[(-?\d+), (-?\d+)\], but got (-?\d+)\)"
)
def _dim_range(m: re.Match) -> Explanation:
    low, high, got = (int(g) for g in m.groups())
    ndim = high + 1
    return Explanation(
        "dim_out_of_range",
        m.group(0),
        f"an op asked for axis {got} of a tensor with {ndim} axes",
        (Operand("input", f"{ndim} axes (valid axes {low}..{high})"),),
        "in attention code this is usually a transpose/softmax written for [batch, heads, seq, d_k] "
        "applied to a tensor whose heads were never split (a missing .view(batch, seq, heads, d_k)) "
        "or were already merged back",
    )


# -- masks -----------------------------------------------------------------------------------


@_rule(r"masked_fill_? only supports boolean masks, but got mask with dtype ([\w ]+)")
def _masked_fill_dtype(m: re.Match) -> Explanation:
    return Explanation(
        "mask_dtype",
        m.group(0),
        f"masked_fill needs a bool mask, but the mask is {m.group(1).strip()}",
        (Operand("mask", f"dtype {m.group(1).strip()}  (masked_fill fills where it is True)"),),
        "compare to make it bool, minding the polarity: scores.masked_fill(mask == 0, float('-inf')) "
        "for a 1 = attend mask; mask.bool() when 1 already means 'fill'",
    )


@_rule(
    r"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
    r"attn_mask\.dtype: ([\w ]+?) and\s+query\.dtype: ([\w ]+?) instead\.?"
)
def _sdpa_mask_dtype(m: re.Match) -> Explanation:
    mask_dtype, query_dtype = m.group(1).strip(), m.group(2).strip()
    return Explanation(
        "sdpa_mask_dtype",
        m.group(0),
        f"scaled_dot_product_attention: attn_mask is {mask_dtype}; it must be bool or the query's "
        f"dtype ({query_dtype})",
        (
            Operand("attn_mask", f"dtype {mask_dtype}"),
            Operand("query", f"dtype {query_dtype}"),
        ),
        "a bool mask means True = attend (the opposite of nn.MultiheadAttention's key_padding_mask): "
        "attn_mask=mask.bool(); an additive float mask must be 0 / -inf in the query's dtype: "
        "mask.to(q.dtype)",
    )


@_rule(r"Number of heads in key and value must divide the number of heads in\s*(?:query)?")
def _sdpa_gqa(m: re.Match) -> Explanation:
    return Explanation(
        "sdpa_gqa_heads",
        m.group(0).strip(),
        "scaled_dot_product_attention(enable_gqa=True): the key/value head count must divide the "
        "query head count (torch's message is cut off mid-sentence)",
        (
            Operand("query", "[batch, heads_q, seq_q, d_k]"),
            Operand("key", "[batch, heads_kv, seq_k, d_k]  with heads_q % heads_kv == 0"),
        ),
        "check n_kv_heads against n_heads (e.g. 32 query heads with 8, 4, 2 or 1 kv heads), and "
        "that k and v were viewed with n_kv_heads, not n_heads",
    )


@_rule(r"Explicit attn_mask should not be set when is_causal=True")
def _sdpa_causal_mask(m: re.Match) -> Explanation:
    return Explanation(
        "sdpa_mask_and_causal",
        m.group(0),
        "scaled_dot_product_attention: attn_mask and is_causal=True were both given",
        (),
        "pass one: is_causal=True alone for a causal model, or fold causality into the mask "
        "(mask & torch.ones(L, S, dtype=torch.bool).tril()) and drop is_causal; torch's default CPU "
        "kernel accepts both silently, other kernels raise",
    )


# -- nn.MultiheadAttention -------------------------------------------------------------------


@_rule(r"embed_dim must be divisible by num_heads")
def _mha_divisible(m: re.Match) -> Explanation:
    return Explanation(
        "head_divisibility",
        m.group(0),
        "nn.MultiheadAttention(embed_dim, num_heads): embed_dim % num_heads != 0",
        (),
        "each head gets d_k = embed_dim // num_heads features, so num_heads must divide embed_dim "
        "(for embed_dim 512: 1, 2, 4, 8, 16, 32, ...)",
    )


@_rule(r"Expected key_padded_mask\.shape\[1\] to be (\d+), but got (\d+)")
def _mha_key_padding(m: re.Match) -> Explanation:
    want, got = int(m.group(1)), int(m.group(2))
    return Explanation(
        "mha_key_padding_mask",
        m.group(0),
        f"nn.MultiheadAttention: key_padding_mask has {got} positions, but the keys have seq_k={want}",
        (
            Operand(
                "key_padding_mask",
                f"[batch, {got}]  must be [batch, seq_k={want}], True = ignore (padding)",
            ),
        ),
        "build the mask from the key sequence (not the query) and with the same padding; for "
        "batch_first=False inputs the key is [seq_k, batch, E], so seq_k is its first axis",
    )


@_rule(
    r"The shape of the 3D attn_mask is torch\.Size\(\[(\d+), (\d+), (\d+)\]\), but should be \((\d+), (\d+), (\d+)\)\.?"
)
def _mha_mask_3d(m: re.Match) -> Explanation:
    got = [int(g) for g in m.groups()[:3]]
    want = [int(g) for g in m.groups()[3:]]
    hint = "a 3-D attn_mask is one [seq_q, seq_k] mask per (batch, head) pair, batch and heads flattened"
    if got[0] and want[0] % got[0] == 0 and got[1:] == want[1:]:
        hint = (
            f"{want[0]} = batch x num_heads and the mask has {got[0]}: repeat it per head with "
            f"attn_mask.repeat_interleave({want[0] // got[0]}, dim=0), or pass a 2-D [seq_q, seq_k] mask "
            "shared by all"
        )
    return Explanation(
        "mha_attn_mask_3d",
        m.group(0),
        f"nn.MultiheadAttention: a 3-D attn_mask must be [batch*num_heads={want[0]}, seq_q={want[1]}, "
        f"seq_k={want[2]}]",
        (Operand("attn_mask", f"[{', '.join(map(str, got))}]"),),
        hint + "; for a bool mask True = not allowed to attend (the opposite of SDPA)",
    )


@_rule(
    r"The shape of the 2D attn_mask is torch\.Size\(\[(\d+), (\d+)\]\), but should be \((\d+), (\d+)\)\.?"
)
def _mha_mask_2d(m: re.Match) -> Explanation:
    got0, got1, want0, want1 = (int(g) for g in m.groups())
    return Explanation(
        "mha_attn_mask_2d",
        m.group(0),
        f"nn.MultiheadAttention: a 2-D attn_mask must be [seq_q={want0}, seq_k={want1}]",
        (Operand("attn_mask", f"[{got0}, {got1}]"),),
        "rows are queries and columns keys; for a padding mask per batch element use key_padding_mask "
        "[batch, seq_k] instead",
    )


@_rule(r"was expecting embedding dimension of (\d+), but got (\d+)")
def _mha_embed(m: re.Match) -> Explanation:
    want, got = int(m.group(1)), int(m.group(2))
    return Explanation(
        "mha_embed_dim",
        m.group(0),
        f"nn.MultiheadAttention: the query's last axis is {got}, but embed_dim is {want}",
        (Operand("query", f"[..., {got}]  must end in embed_dim={want}"),),
        "nn.MultiheadAttention splits heads itself: give it [seq, batch, embed_dim] (or "
        "[batch, seq, embed_dim] with batch_first=True), not per-head tensors; or build it with "
        f"embed_dim={got}",
    )


@_rule(
    r"key shape torch\.Size\(\[([\d, ]+)\]\) does not match value shape torch\.Size\(\[([\d, ]+)\]\)"
)
def _mha_kv(m: re.Match) -> Explanation:
    return Explanation(
        "mha_key_value",
        m.group(0),
        "nn.MultiheadAttention: key and value must have the same shape (one value per key)",
        (Operand("key", f"[{m.group(1)}]"), Operand("value", f"[{m.group(2)}]")),
        "keys and values come from the same sequence: check that both were sliced or padded alike",
    )


@_rule(r"query should be unbatched 2D or batched 3D tensor but received (\d+)-D query tensor")
def _mha_rank(m: re.Match) -> Explanation:
    return Explanation(
        "mha_rank",
        m.group(0),
        f"nn.MultiheadAttention takes 2-D or 3-D inputs; the query has {m.group(1)} axes",
        (
            Operand(
                "query", "[seq, batch, embed_dim], or [batch, seq, embed_dim] with batch_first=True"
            ),
        ),
        "it projects and splits heads itself: pass the token embeddings, not [batch, heads, seq, d_k]",
    )


# -- flash-attn ------------------------------------------------------------------------------

_FLASH_LAYOUT = (
    "flash-attn wants q [batch, seqlen_q, nheads, headdim] and k, v [batch, seqlen_k, nheads_k, "
    "headdim], fp16 or bf16, on CUDA"
)


@_rule(r"cannot import name 'flash_attention' from 'flash_attn'[^\n]*")
def _flash_import(m: re.Match) -> Explanation:
    return Explanation(
        "flash_import",
        m.group(0),
        "flash_attn has no function named flash_attention",
        (),
        "the import is `from flash_attn import flash_attn_func`; call "
        "flash_attn_func(q, k, v, causal=...) with q, k, v as [batch, seq, heads, head_dim] "
        "fp16/bf16 CUDA tensors (from [batch, heads, seq, head_dim] use .transpose(1, 2)); "
        "shapeguard.attention.flash_attention checks that contract and falls back to SDPA off the GPU",
    )


@_rule(r"No module named 'flash_attn[\w.]*'")
def _flash_missing(m: re.Match) -> Explanation:
    return Explanation(
        "flash_missing",
        m.group(0),
        "flash-attn is not installed (or its CUDA extension did not build)",
        (),
        "it needs an NVIDIA GPU (Ampere or newer) and CUDA: pip install flash-attn --no-build-isolation; "
        "without one, F.scaled_dot_product_attention computes the same attention on "
        "[batch, heads, seq, head_dim] tensors",
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


@_rule(r"\b(\w+) must have shape \(([^()]*)\)")
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


@_rule(r"FlashAttention only supports? fp16 and bf16 data type")
def _flash_dtype(m: re.Match) -> Explanation:
    return Explanation(
        "flash_dtype",
        m.group(0),
        "flash-attn: q, k and v must be float16 or bfloat16",
        (),
        "cast with q.to(torch.bfloat16) (and k, v), or run under torch.autocast('cuda', "
        "dtype=torch.bfloat16); a LayerNorm/RMSNorm kept in float32 often upcasts the tensor before "
        "attention",
    )


@_rule(r"query and (key|value) must have the same dtype")
def _flash_same_dtype(m: re.Match) -> Explanation:
    return Explanation(
        "flash_dtype_mismatch",
        m.group(0),
        f"flash-attn: the query and the {m.group(1)} have different dtypes",
        (),
        "cast all three to one of float16 / bfloat16 (a KV cache kept in another dtype is the usual cause)",
    )


@_rule(r"\b(\w+) must be on CUDA")
def _flash_cuda(m: re.Match) -> Explanation:
    return Explanation(
        "flash_device",
        m.group(0),
        f"flash-attn: {m.group(1)} is not on a CUDA device",
        (),
        "move q, k, v to the GPU (.cuda()); on CPU use F.scaled_dot_product_attention with "
        "[batch, heads, seq, head_dim] tensors",
    )


@_rule(r"Input tensor must have contiguous last dimension")
def _flash_contiguous(m: re.Match) -> Explanation:
    return Explanation(
        "flash_contiguous",
        m.group(0),
        "flash-attn: the last axis (head_dim) of q, k or v is strided",
        (),
        "call .contiguous() on the tensor after the permute or slice that moved head_dim "
        "(a transpose(1, 2) alone keeps head_dim contiguous)",
    )


@_rule(r"FlashAttention forward only supports head dimension at most (\d+)")
def _flash_head_dim(m: re.Match) -> Explanation:
    return Explanation(
        "flash_head_dim",
        m.group(0),
        f"flash-attn: head_dim is larger than {m.group(1)}",
        (Operand("q", "[batch, seqlen_q, nheads, headdim]  headdim is the last axis"),),
        "check that the last axis is head_dim (d_model // n_heads), not d_model or a sequence length "
        "from a layout mix-up; otherwise use more heads or SDPA",
    )


@_rule(r"Number of heads in key/value must divide number of heads in query")
def _flash_gqa(m: re.Match) -> Explanation:
    return Explanation(
        "flash_gqa_heads",
        m.group(0),
        "flash-attn: nheads (q) % nheads_k (k, v) != 0",
        (
            Operand("q", "[batch, seqlen_q, nheads, headdim]"),
            Operand("k", "[batch, seqlen_k, nheads_k, headdim]"),
        ),
        "the heads are axis 2 in flash-attn's layout: a [batch, heads, seq, head_dim] tensor puts the "
        "sequence length there (transpose(1, 2)); otherwise n_kv_heads must divide n_heads",
    )


@_rule(r"FlashAttention only supports Ampere GPUs or newer\.?")
def _flash_gpu(m: re.Match) -> Explanation:
    return Explanation(
        "flash_gpu",
        m.group(0),
        "flash-attn 2 runs on Ampere (sm80) or newer GPUs only",
        (),
        "on older GPUs or CPU use F.scaled_dot_product_attention (its memory-efficient kernel runs "
        "on older GPUs), with [batch, heads, seq, head_dim] tensors",
    )
