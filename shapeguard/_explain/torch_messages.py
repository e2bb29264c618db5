"""`shapeguard explain`'s rules for PyTorch's own messages: Linear, matmul, broadcasting,
view, masks, scaled_dot_product_attention and nn.MultiheadAttention."""

import re

from .._axes import divisors
from .._errors import Operand
from .rules import Explanation, Rules, factor_pairs, ints, prime_factors

RULES = Rules()

_SCORES_AXES = ("batch", "heads", "seq_q", "seq_k")


# -- Linear / mm -----------------------------------------------------------------------------


@RULES.rule(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)")
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


@RULES.rule(
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


RULES.fixed(
    r"(batch[12]) must be a 3D tensor",
    "bmm_rank",
    "torch.bmm takes 3-D tensors [batch, rows, cols]; {0} has another number of axes",
    "for [batch, heads, seq, d_k] tensors use torch.matmul (or @), which broadcasts over both "
    "leading axes; or flatten them first: x.reshape(batch * heads, seq, d_k)",
)


# -- broadcasting ----------------------------------------------------------------------------


@RULES.rule(
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


# -- einsum ----------------------------------------------------------------------------------


@RULES.rule(
    r"einsum\(\): subscript (\w) has size (\d+) for operand (\d+) which does not broadcast "
    r"with previously seen size (\d+)"
)
def _einsum_size(m: re.Match) -> Explanation:
    letter, size, operand, seen = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    hints = [
        f"every operand must give subscript {letter} the same size (or 1): {letter} is {seen} in an "
        f"operand before operand {operand} and {size} in operand {operand}"
    ]
    big, small = max(size, seen), min(size, seen)
    if small > 1 and big % small == 0:
        hints.append(
            f"{big} = {big // small} x {small}: one operand may hold {big // small} heads "
            f"merged (d_model = heads x d_k) where the other has one head's d_k, or a packed "
            "q/k/v (or k/v) tensor was not split with .chunk(...)"
        )
    hints.append(
        f"otherwise operand {operand}'s subscripts name its axes in another order than it has them "
        "(`b h n d` for a [batch, seq, heads, d_k] tensor): compare the pattern with its shape"
    )
    return Explanation(
        "einsum_dim",
        m.group(0),
        f"einsum: subscript {letter} has size {seen} in an earlier operand but {size} in operand "
        f"{operand} (operands count from 0)",
        (
            Operand("earlier", f"{letter}={seen}"),
            Operand(f"operand {operand}", f"{letter}={size}"),
        ),
        "; ".join(hints),
    )


# -- view / reshape --------------------------------------------------------------------------


@RULES.rule(r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)")
def _view_size(m: re.Match) -> Explanation:
    target = ints(m.group(1))
    numel = int(m.group(2))
    known = 1
    for s in target:
        if s != -1:
            known *= s
    operands = [
        Operand("input", f"{numel} elements = {prime_factors(numel)}"),
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
            fits = ", ".join(map(str, [d for d in divisors(d_model) if d > 1][:8]))
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


RULES.fixed(
    r"view size is not compatible with input tensor's size and stride[^\n]*",
    "noncontiguous_view",
    "view cannot merge axes of a non-contiguous tensor (typically context after .transpose(1, 2))",
    "merge heads with context.transpose(1, 2).contiguous().view(batch, seq, d_model), or use "
    ".reshape(...), which copies when it must",
    (
        "input",
        "a transposed view, e.g. context [batch, seq, heads, d_k] made by "
        "transpose(1, 2) of [batch, heads, seq, d_k]",
    ),
)


@RULES.rule(
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


RULES.fixed(
    r"masked_fill_? only supports boolean masks, but got mask with dtype ([\w ]+)",
    "mask_dtype",
    "masked_fill needs a bool mask, but the mask is {0}",
    "compare to make it bool, minding the polarity: scores.masked_fill(mask == 0, float('-inf')) "
    "for a 1 = attend mask; mask.bool() when 1 already means 'fill'",
    ("mask", "dtype {0}  (masked_fill fills where it is True)"),
)
RULES.fixed(
    r"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
    r"attn_mask\.dtype: ([\w ]+?) and\s+query\.dtype: ([\w ]+?) instead\.?",
    "sdpa_mask_dtype",
    "scaled_dot_product_attention: attn_mask is {0}; it must be bool or the query's dtype ({1})",
    "a bool mask means True = attend (the opposite of nn.MultiheadAttention's key_padding_mask): "
    "attn_mask=mask.bool(); an additive float mask must be 0 / -inf in the query's dtype: "
    "mask.to(q.dtype)",
    ("attn_mask", "dtype {0}"),
    ("query", "dtype {1}"),
)
# torch cuts this message off mid-sentence; `query` may or may not follow.
RULES.fixed(
    r"Number of heads in key and value must divide the number of heads in(?:\s*query)?",
    "sdpa_gqa_heads",
    "scaled_dot_product_attention(enable_gqa=True): the key/value head count must divide the "
    "query head count (torch's message is cut off mid-sentence)",
    "check n_kv_heads against n_heads (e.g. 32 query heads with 8, 4, 2 or 1 kv heads), and "
    "that k and v were viewed with n_kv_heads, not n_heads",
    ("query", "[batch, heads_q, seq_q, d_k]"),
    ("key", "[batch, heads_kv, seq_k, d_k]  with heads_q % heads_kv == 0"),
)
RULES.fixed(
    r"Explicit attn_mask should not be set when is_causal=True",
    "sdpa_mask_and_causal",
    "scaled_dot_product_attention: attn_mask and is_causal=True were both given",
    "pass one: is_causal=True alone for a causal model, or fold causality into the mask "
    "(mask & torch.ones(L, S, dtype=torch.bool).tril()) and drop is_causal; torch's default CPU "
    "kernel accepts both silently, other kernels raise",
)


# -- nn.MultiheadAttention -------------------------------------------------------------------


RULES.fixed(
    r"embed_dim must be divisible by num_heads",
    "head_divisibility",
    "nn.MultiheadAttention(embed_dim, num_heads): embed_dim % num_heads != 0",
    "each head gets d_k = embed_dim // num_heads features, so num_heads must divide embed_dim "
    "(for embed_dim 512: 1, 2, 4, 8, 16, 32, ...)",
)
RULES.fixed(
    r"Expected key_padded_mask\.shape\[0\] to be (\d+), but got (\d+)",
    "mha_key_padding_mask",
    "nn.MultiheadAttention: key_padding_mask has {1} rows, but the module reads a batch of {0} "
    "from the key",
    "built without batch_first=True, nn.MultiheadAttention reads the key as [seq_k, batch, E], "
    "so its batch is the key's axis 1; a batch-first key [batch, seq_k, E] then gives the module "
    "your seq_k ({0}) as its batch: build it with nn.MultiheadAttention(..., batch_first=True), "
    "or pass query, key and value as x.transpose(0, 1); key_padding_mask itself is always "
    "[batch, seq_k]",
    ("key_padding_mask", "[{1}, ...]  must be [batch={0}, seq_k] as the module reads the key"),
)
RULES.fixed(
    r"Expected key_padded_mask\.shape\[1\] to be (\d+), but got (\d+)",
    "mha_key_padding_mask",
    "nn.MultiheadAttention: key_padding_mask has {1} positions, but the keys have seq_k={0}",
    "build the mask from the key sequence (not the query) and with the same padding; for "
    "batch_first=False inputs the key is [seq_k, batch, E], so seq_k is its first axis",
    ("key_padding_mask", "[batch, {1}]  must be [batch, seq_k={0}], True = ignore (padding)"),
)


@RULES.rule(
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


RULES.fixed(
    r"The shape of the 2D attn_mask is torch\.Size\(\[(\d+), (\d+)\]\), but should be "
    r"\((\d+), (\d+)\)\.?",
    "mha_attn_mask_2d",
    "nn.MultiheadAttention: a 2-D attn_mask must be [seq_q={2}, seq_k={3}]",
    "rows are queries and columns keys; for a padding mask per batch element use key_padding_mask "
    "[batch, seq_k] instead",
    ("attn_mask", "[{0}, {1}]"),
)
RULES.fixed(
    r"was expecting embedding dimension of (\d+), but got (\d+)",
    "mha_embed_dim",
    "nn.MultiheadAttention: the query's last axis is {1}, but embed_dim is {0}",
    "nn.MultiheadAttention splits heads itself: give it [seq, batch, embed_dim] (or "
    "[batch, seq, embed_dim] with batch_first=True), not per-head tensors; or build it with "
    "embed_dim={1}",
    ("query", "[..., {1}]  must end in embed_dim={0}"),
)
RULES.fixed(
    r"key shape torch\.Size\(\[([\d, ]+)\]\) does not match value shape "
    r"torch\.Size\(\[([\d, ]+)\]\)",
    "mha_key_value",
    "nn.MultiheadAttention: key and value must have the same shape (one value per key)",
    "keys and values come from the same sequence: check that both were sliced or padded alike",
    ("key", "[{0}]"),
    ("value", "[{1}]"),
)
RULES.fixed(
    r"query should be unbatched 2D or batched 3D tensor but received (\d+)-D query tensor",
    "mha_rank",
    "nn.MultiheadAttention takes 2-D or 3-D inputs; the query has {0} axes",
    "it projects and splits heads itself: pass the token embeddings, not [batch, heads, seq, d_k]",
    ("query", "[seq, batch, embed_dim], or [batch, seq, embed_dim] with batch_first=True"),
)
