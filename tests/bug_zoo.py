"""A zoo of silent attention bugs, each written in several code styles, and the fixed code.

Every module takes its sizes as constructor arguments, as real code does, and most take a
`bug`: None builds the correct module, a bug's name makes the one change that bug is. The
lines a bug touches, and the line where it first bites, end in `# <- name`; the tests read
these marks to check that a finding points at the user's line. `# <- name/kind` admits only
a finding of that kind on the line (the consumer of a carved view, where a coincidence of
sizes lets it read as a forgotten transpose).

The names of the bugs:

    carve             heads carved out of the sequence axis: x.view(B, h, S, d_k)
    merge             heads merged back without the transpose: ctx.reshape(B, S, d_model)
    no_transpose      the transpose after the head split forgotten: [B, S, h, d_k] used as
                      [B, h, S, d_k]
    mha_batch_first   nn.MultiheadAttention(batch_first=False) fed [B, S, E]
    softmax_axis      softmax over the queries of the scores
    mask_axis         a padding mask laid on the query axis
    mask_polarity     a mask whose True (or 1) means the opposite of what its consumer reads
    mask_direction    a causal triangle that hides the past
    fold_order        heads folded into the batch in one order, unfolded in the other
    mask_repeat       a per-example mask repeated for the heads in the wrong order
    bias_constant     a score bias constant along the keys (softmax cancels it)
    patchify          a patch grid flattened without the permute it needs
    relpos_view       a gathered [S*S, h] relative-position bias viewed as [h, S, S]
    contraction       a product that contracts the wrong axes when seq == d_k
    rotary_axis       rotary cos/sin broadcast along the heads instead of the positions
    causal_alignment  is_causal=True on a decode step against a KV cache
    cat_axis          text and image tokens concatenated along their heads (joint attention)
"""

import math
from dataclasses import dataclass

import einops
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


@dataclass(frozen=True)
class Sizes:
    """One size setting. seq_k is the memory of cross-attention and the cache plus the new
    tokens of a decode step; channels, patch and grid describe images for patch embedding."""

    name: str
    batch: int
    heads: int
    seq: int
    d_k: int
    seq_k: int
    kv_heads: int
    channels: int
    patch: int
    grid: tuple[int, int]

    @property
    def d_model(self) -> int:
        return self.heads * self.d_k

    @property
    def rope_d_k(self) -> int:
        """RoPE rotates pairs of features, so its head size is d_k rounded up to even."""
        return self.d_k + self.d_k % 2

    @property
    def image(self) -> tuple[int, int]:
        return self.grid[0] * self.patch, self.grid[1] * self.patch

    def lengths(self) -> list[int]:
        """Real-token counts of a right-padded batch: the first example is full, the others
        shorter and different from each other, none empty."""
        return [self.seq - (i * (self.seq - 1)) // self.batch for i in range(self.batch)]


# Pairwise-distinct sizes: a swapped axis cannot line up by chance (RoPE uses d_k 12).
DISTINCT = Sizes("distinct", 2, 3, 5, 11, 7, 1, 3, 2, (5, 7))
# Everything 4: batch == seq == heads == d_k == channels == grid side, patch dim == d_model.
COINCIDENT = Sizes("coincident", 4, 4, 4, 4, 8, 2, 4, 2, (4, 4))
# One layer of a real model: seq == d_k == 64, 64 patches of 16 x 16 pixels.
REALISTIC = Sizes("realistic", 4, 8, 64, 64, 96, 2, 3, 16, (8, 8))
SETTINGS = (DISTINCT, COINCIDENT, REALISTIC)


def attention_mask(sizes: Sizes) -> torch.Tensor:
    """Hugging Face's [batch, seq] padding mask: 1 for real tokens, 0 for right padding."""
    positions = torch.arange(sizes.seq)[None, :]
    return (positions < torch.tensor(sizes.lengths())[:, None]).long()


# -- the tutorial: W_q/W_k/W_v/W_o, view + transpose, torch.matmul ----------------------
class TutorialMHA(nn.Module):
    """The tutorial's multi-head self-attention. attention_mask is [batch, seq] with 1 for
    real tokens; causal=True hides the future instead."""

    def __init__(self, d_model, n_heads, causal=False, bug=None):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.causal, self.bug = causal, bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def split_heads(self, t, B, S):
        """[B, S, d_model] -> [B, h, S, d_k]."""
        if self.bug == "carve":
            return t.view(B, self.n_heads, S, self.d_k)  # <- carve
        if self.bug == "no_transpose":
            return t.view(B, S, self.n_heads, self.d_k)  # <- no_transpose
        return t.view(B, S, self.n_heads, self.d_k).transpose(1, 2)

    def forward(self, x, attention_mask=None):
        B, S, _ = x.shape
        Q = self.split_heads(self.W_q(x), B, S)
        K = self.split_heads(self.W_k(x), B, S)
        V = self.split_heads(self.W_v(x), B, S)
        K_t = K.transpose(-2, -1)
        scores = torch.matmul(Q, K_t) / math.sqrt(self.d_k)  # <- no_transpose, carve/layout_bshd
        if attention_mask is not None:
            if self.bug == "mask_axis":
                mask = attention_mask[:, None, :, None]  # <- mask_axis
            else:
                mask = attention_mask[:, None, None, :]  # [B, 1, 1, S_k]: padding hides keys
            if self.bug == "mask_polarity":
                scores = scores.masked_fill(mask == 1, float("-inf"))  # <- mask_polarity
            else:
                scores = scores.masked_fill(mask == 0, float("-inf"))  # <- mask_axis
        if self.causal:
            ones = torch.ones(S, S, dtype=torch.bool)
            keep = ones.triu() if self.bug == "mask_direction" else ones.tril()  # <- mask_direction
            scores = scores.masked_fill(~keep, float("-inf"))  # <- mask_direction
        attn = F.softmax(scores, dim=-2 if self.bug == "softmax_axis" else -1)  # <- softmax_axis
        if self.bug == "contraction":
            context = torch.matmul(attn, V.transpose(-2, -1))  # <- contraction
        else:
            context = torch.matmul(attn, V)  # [B, h, S, d_k]
        if self.bug in ("merge", "no_transpose"):
            context = context.reshape(B, S, self.d_model)  # <- merge
        else:
            context = context.transpose(1, 2).reshape(B, S, self.d_model)
        return self.W_o(context)


class FoldedHeads(nn.Module):
    """Tutorial attention on torch.bmm: heads folded into the batch as [B * h, S, d_k]."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.bug = bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, _ = x.shape
        h, d_k = self.n_heads, self.d_k
        Q = self.W_q(x).view(B, S, h, d_k).transpose(1, 2).reshape(B * h, S, d_k)
        K = self.W_k(x).view(B, S, h, d_k).transpose(1, 2).reshape(B * h, S, d_k)
        V = self.W_v(x).view(B, S, h, d_k).transpose(1, 2).reshape(B * h, S, d_k)
        attn = torch.softmax(torch.bmm(Q, K.transpose(1, 2)) / math.sqrt(d_k), dim=-1)
        out = torch.bmm(attn, V)  # [B * h, S, d_k], example-major
        if self.bug == "fold_order":
            out = out.view(h, B, S, d_k).transpose(0, 1)  # <- fold_order
        else:
            out = out.view(B, h, S, d_k)
        return self.W_o(out.transpose(1, 2).reshape(B, S, self.d_model))


class AlibiAttention(nn.Module):
    """Causal tutorial attention with ALiBi: score(i, j) - slope_h * (i - j)."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.bug = bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, x):
        B, S, _ = x.shape
        Q = self.W_q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        pos = torch.arange(S)
        if self.bug == "bias_constant":
            alibi = self.slopes[:, None, None] * pos[:, None]  # <- bias_constant
        else:
            distance = pos[:, None] - pos[None, :]  # [S_q, S_k]: how far back key j is
            alibi = -self.slopes[:, None, None] * distance  # [h, S_q, S_k]
        scores = scores + alibi  # <- bias_constant
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        attn = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        context = torch.matmul(attn, V).transpose(1, 2).reshape(B, S, self.d_model)
        return self.W_o(context)


def alibi_slopes(n_heads):
    """ALiBi's geometric slopes, 2^(-8 i / n) for head i = 1..n."""
    return torch.tensor([2 ** (-8 * (i + 1) / n_heads) for i in range(n_heads)])


# -- Hugging Face: q_proj/k_proj/v_proj/o_proj, attn_weights, eager and sdpa -------------
def repeat_kv(hidden_states, n_rep):
    """[B, kv_heads, S, d] -> [B, kv_heads * n_rep, S, d], as in transformers."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(
        batch, num_key_value_heads, n_rep, slen, head_dim
    )
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class HFAttention(nn.Module):
    """Llama-style attention as transformers writes it: grouped kv heads (repeat_kv for
    eager, enable_gqa for sdpa); attention_mask is [batch, seq] with 1 for real tokens."""

    def __init__(
        self, hidden_size, num_heads, num_key_value_heads, attn_implementation="eager", bug=None
    ):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_heads
        self.num_key_value_groups = num_heads // num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attn_implementation, self.bug = attn_implementation, bug
        kv_dim = num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, kv_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, kv_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        bsz, q_len, _ = hidden_states.shape
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        if self.bug == "carve":
            h, h_kv, d = self.num_heads, self.num_key_value_heads, self.head_dim
            query_states = query_states.view(bsz, h, q_len, d)  # <- carve
            key_states = key_states.view(bsz, h_kv, q_len, d)  # <- carve
            value_states = value_states.view(bsz, h_kv, q_len, d)  # <- carve
        else:
            query_states = query_states.view(bsz, q_len, -1, self.head_dim)
            key_states = key_states.view(bsz, q_len, -1, self.head_dim)
            value_states = value_states.view(bsz, q_len, -1, self.head_dim)
            if self.bug != "no_transpose":  # the bug keeps flash-attn's [B, S, h, d] layout
                query_states = query_states.transpose(1, 2)
                key_states = key_states.transpose(1, 2)
                value_states = value_states.transpose(1, 2)
        if self.attn_implementation == "sdpa":
            attn_output = self.sdpa(query_states, key_states, value_states, attention_mask)
        else:
            attn_output = self.eager(query_states, key_states, value_states, attention_mask)
        if self.bug not in ("merge", "no_transpose"):
            attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.reshape(bsz, q_len, -1).contiguous()  # <- merge
        return self.o_proj(attn_output)

    def eager(self, query_states, key_states, value_states, attention_mask):
        key_states = repeat_kv(key_states, self.num_key_value_groups)
        value_states = repeat_kv(value_states, self.num_key_value_groups)
        if self.bug == "contraction":
            attn_weights = torch.matmul(query_states, key_states) * self.scaling  # <- contraction
        else:
            key_t = key_states.transpose(2, 3)
            attn_weights = torch.matmul(query_states, key_t) * self.scaling  # <- carve/layout_bshd
        if attention_mask is not None:
            if self.bug == "mask_axis":
                expanded = attention_mask[:, None, :, None]  # <- mask_axis
            else:
                expanded = attention_mask[:, None, None, :]  # [B, 1, 1, S_k]
            dtype = query_states.dtype
            additive = (1.0 - expanded.to(dtype)) * torch.finfo(dtype).min
            attn_weights = attn_weights + additive  # <- mask_axis
        dim = 2 if self.bug == "softmax_axis" else -1
        attn_weights = F.softmax(attn_weights, dim=dim, dtype=torch.float32)  # <- softmax_axis
        attn_weights = attn_weights.to(query_states.dtype)
        return torch.matmul(attn_weights, value_states)

    def sdpa(self, query_states, key_states, value_states, attention_mask):
        attn_mask = None
        if attention_mask is not None:
            attn_mask = attention_mask[:, None, None, :].bool()  # SDPA attends where True
        return F.scaled_dot_product_attention(  # <- no_transpose
            query_states,
            key_states,
            value_states,
            attn_mask=attn_mask,
            scale=self.scaling,
            enable_gqa=self.num_key_value_groups > 1,
        )


class CrossAttention(nn.Module):
    """Hugging Face-style cross-attention: queries from x [B, S_q, d], keys and values from
    memory [B, S_k, d] with its [B, S_k] padding mask (1 = real)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, memory, memory_mask):
        bsz, q_len, _ = hidden_states.shape
        kv_len = memory.shape[1]
        q = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(memory).view(bsz, kv_len, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(memory).view(bsz, kv_len, -1, self.head_dim).transpose(1, 2)
        keep = memory_mask[:, None, None, :].bool()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


class HFCachedAttention(nn.Module):
    """A decoding step in Hugging Face style: the new tokens' keys and values are appended
    to the cache (past_key, past_value: [B, h, S_past, d]) before SDPA."""

    def __init__(self, hidden_size, num_heads, bug=None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        self.bug = bug
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, past_key, past_value):
        bsz, q_len, _ = hidden_states.shape
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = torch.cat([past_key, key_states], dim=-2)
        value_states = torch.cat([past_value, value_states], dim=-2)
        if self.bug == "causal_alignment":
            out = F.scaled_dot_product_attention(  # <- causal_alignment
                query_states, key_states, value_states, is_causal=True
            )
        else:
            kv_len = key_states.shape[-2]
            # Bottom-right: new token i sees the whole cache and the new tokens up to i.
            causal_mask = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
            out = F.scaled_dot_product_attention(
                query_states, key_states, value_states, attn_mask=causal_mask
            )
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


def decode_attention(q, k, v, bug=None):
    """Functional SDPA for a decode step: q [B, h, S_q, d] are the new tokens, k and v
    [B, h, S_k, d] the cache followed by them."""
    if bug == "causal_alignment":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # <- causal_alignment
    S_q, S_k = q.size(-2), k.size(-2)
    keep = torch.ones(S_q, S_k, dtype=torch.bool).tril(S_k - S_q)  # aligned bottom-right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


# -- rotary position embeddings ----------------------------------------------------------
def rotate_half(x):
    """Rotates half the hidden dims of the input, as in transformers."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' RoPE: cos/sin [B, S, d] get an axis at unsqueeze_dim for the heads, 1
    for [B, h, S, d], 2 for [B, S, h, d]."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (rotate_half(q) * sin)  # <- rotary_axis
    k_embed = (k * cos) + (rotate_half(k) * sin)  # <- rotary_axis
    return q_embed, k_embed


class RotaryEmbedding(nn.Module):
    """transformers' rotary embedding: cos and sin [B, S, head_dim] for position_ids [B, S]."""

    def __init__(self, head_dim, base=10000.0):
        super().__init__()
        inv_freq = 1.0 / (
            base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        inv_freq_expanded = (
            self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        )
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)  # [B, S, d / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class HFRotaryAttention(nn.Module):
    """Llama-style causal attention with RoPE. layout="bshd" applies it on [B, S, h, d],
    before the transpose (as ports from flash-attn code do), so cos/sin need unsqueeze_dim=2;
    layout="bhsd" is transformers' own order, after the transpose, unsqueeze_dim=1."""

    def __init__(self, hidden_size, num_heads, head_dim, layout="bshd", bug=None):
        super().__init__()
        self.num_heads, self.head_dim, self.layout, self.bug = num_heads, head_dim, layout, bug
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=False)
        self.rotary_emb = RotaryEmbedding(head_dim)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        position_ids = torch.arange(q_len)[None, :].expand(bsz, -1)
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape)  # [B, S, h, d]
        key_states = self.k_proj(hidden_states).view(hidden_shape)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = self.rotary_emb(value_states, position_ids)
        if self.layout == "bshd":
            unsqueeze_dim = 1 if self.bug == "rotary_axis" else 2
            query_states, key_states = apply_rotary_pos_emb(  # <- rotary_axis
                query_states, key_states, cos, sin, unsqueeze_dim=unsqueeze_dim
            )
            query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)
        else:
            query_states, key_states = query_states.transpose(1, 2), key_states.transpose(1, 2)
            query_states, key_states = apply_rotary_pos_emb(
                query_states, key_states, cos, sin, unsqueeze_dim=1
            )
        out = F.scaled_dot_product_attention(query_states, key_states, value_states, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, q_len, -1))


def precompute_freqs_cis(dim, end, theta=10000.0):
    """Meta's llama: e^(i * t * theta^(-2k / dim)) as complex64 [end, dim / 2]."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def reshape_for_broadcast(freqs_cis, x, bug=None):
    """freqs_cis [S, d / 2] -> [1, S, 1, d / 2] against x [B, S, h, d / 2]."""
    if bug == "rotary_axis":  # the shape for [B, h, S, d / 2]
        return freqs_cis.view(1, 1, *freqs_cis.shape)  # <- rotary_axis
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis, bug=None):
    """Meta's llama RoPE: adjacent feature pairs as complex numbers, times freqs_cis."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_, bug)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)  # <- rotary_axis
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)  # <- rotary_axis
    return xq_out.type_as(xq), xk_out.type_as(xk)


class LlamaAttention(nn.Module):
    """Meta's llama reference attention: wq/wk/wv/wo, complex freqs_cis on [B, S, h, d],
    an additive causal mask."""

    def __init__(self, dim, n_heads, head_dim, max_seq_len, bug=None):
        super().__init__()
        self.n_heads, self.head_dim, self.bug = n_heads, head_dim, bug
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        freqs_cis = precompute_freqs_cis(head_dim, max_seq_len * 2)
        self.register_buffer("freqs_cis", freqs_cis, persistent=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, self.freqs_cis[:seqlen], bug=self.bug)  # <- rotary_axis
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        mask = torch.full((seqlen, seqlen), float("-inf"), dtype=x.dtype).triu(1)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = F.softmax((scores + mask).float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, xv).transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


# -- nanoGPT: fused c_attn + split -------------------------------------------------------
class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention: the causal bias buffer, or flash (SDPA is_causal)."""

    def __init__(self, n_embd, n_head, block_size, flash=False, bug=None):
        super().__init__()
        self.n_head, self.n_embd, self.flash, self.bug = n_head, n_embd, flash, bug
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        ones = torch.ones(block_size, block_size)
        tri = torch.triu(ones) if bug == "mask_direction" else torch.tril(ones)  # <- mask_direction
        self.register_buffer("bias", tri.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        if self.bug == "carve":  # view refuses these column slices of c_attn; reshape copies
            k = k.reshape(B, self.n_head, T, hs)  # <- carve
            q = q.reshape(B, self.n_head, T, hs)  # <- carve
            v = v.reshape(B, self.n_head, T, hs)  # <- carve
        elif self.bug == "no_transpose":
            k = k.view(B, T, self.n_head, hs)  # <- no_transpose
            q = q.view(B, T, self.n_head, hs)  # <- no_transpose
            v = v.view(B, T, self.n_head, hs)  # <- no_transpose
        else:
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(  # <- no_transpose, carve/layout_bshd
                q, k, v, is_causal=True
            )
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # <- carve/layout_bshd
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))  # <- mask_direction
            att = F.softmax(att, dim=-2 if self.bug == "softmax_axis" else -1)  # <- softmax_axis
            y = att @ v
        if self.bug in ("merge", "no_transpose"):
            y = y.contiguous().view(B, T, C)  # <- merge
        else:
            y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


# -- functional SDPA (timm's ViT attention) ----------------------------------------------
class TimmAttention(nn.Module):
    """timm's Attention: one qkv Linear, reshape to [3, B, h, N, d], F.scaled_dot_product_attention.
    attention_mask is [batch, seq] with 1 for real tokens; causal=True builds a tril mask."""

    def __init__(self, dim, num_heads, causal=False, bug=None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.causal, self.bug = causal, bug
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)
        if self.bug == "no_transpose":
            q, k, v = qkv.permute(2, 0, 1, 3, 4).unbind(0)  # <- no_transpose
        else:
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, h, N, d]
        keep = None  # SDPA attends where a bool mask is True
        if attention_mask is not None:
            if self.bug == "mask_axis":
                keep = attention_mask[:, None, :, None].bool()  # <- mask_axis
            elif self.bug == "mask_polarity":
                keep = attention_mask[:, None, None, :] == 0  # <- mask_polarity
            else:
                keep = attention_mask[:, None, None, :].bool()
        if self.causal:
            ones = torch.ones(N, N, dtype=torch.bool)
            keep = ones.triu() if self.bug == "mask_direction" else ones.tril()  # <- mask_direction
        x = F.scaled_dot_product_attention(  # <- no_transpose, mask_axis, mask_polarity, mask_direction
            q, k, v, attn_mask=keep
        )
        x = x.reshape(B, N, C) if self.bug == "no_transpose" else x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class SdpaAlibi(nn.Module):
    """timm-style attention with ALiBi passed to SDPA as a float mask; the bias is laid out
    per key, slope_h * j, which equals -slope_h * (i - j) up to a constant per query."""

    def __init__(self, dim, num_heads, bug=None):
        super().__init__()
        self.num_heads, self.head_dim, self.bug = num_heads, dim // num_heads, bug
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        pos = torch.arange(N, dtype=x.dtype)
        if self.bug == "bias_constant":
            alibi = self.slopes[:, None, None] * pos[:, None]  # <- bias_constant
        else:
            alibi = self.slopes[:, None, None] * pos[None, :]  # [h, 1, N]
        causal = torch.zeros(N, N, dtype=x.dtype).masked_fill(
            torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf")
        )
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=alibi + causal)  # <- bias_constant
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class RelPosAttention(nn.Module):
    """Swin-style learned relative-position bias over a window of `window` tokens: a table
    [2 * window - 1, heads] gathered by relative position into [window * window, heads].
    sdpa=True passes it to SDPA as a float mask, else it is added to the hand-made scores."""

    def __init__(self, dim, num_heads, window, sdpa=False, bug=None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.sdpa, self.bug = sdpa, bug
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        # Unit scale (Swin uses 0.02) so that a misplaced bias shows in the output.
        self.relative_position_bias_table = nn.Parameter(torch.randn(2 * window - 1, num_heads))
        coords = torch.arange(window)
        index = coords[:, None] - coords[None, :] + window - 1  # [window, window]
        self.register_buffer("relative_position_index", index, persistent=False)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        index = self.relative_position_index.view(-1)
        bias = self.relative_position_bias_table[index]  # [N * N, heads]
        if self.bug == "relpos_view":
            bias = bias.view(-1, N, N)  # <- relpos_view
        else:
            bias = bias.view(N, N, -1).permute(2, 0, 1).contiguous()  # [heads, N, N]
        if self.sdpa:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0))
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = (attn + bias.unsqueeze(0)).softmax(dim=-1)
            x = attn @ v
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


# -- BLOOM: fused query_key_value, ALiBi through baddbmm ---------------------------------
class BloomAttention(nn.Module):
    """BLOOM's attention: heads folded into the batch, the ALiBi tensor [B * h, 1, S] the
    input of baddbmm (slope_h * key position), a causal mask."""

    def __init__(self, hidden_size, n_head, bug=None):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, n_head
        self.head_dim = hidden_size // n_head
        self.inv_norm_factor = 1.0 / math.sqrt(self.head_dim)
        self.bug = bug
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def forward(self, hidden_states):
        batch_size, q_length, _ = hidden_states.shape
        h, d = self.num_heads, self.head_dim
        fused_qkv = self.query_key_value(hidden_states).view(batch_size, q_length, h, 3, d)
        query_layer = fused_qkv[..., 0, :].transpose(1, 2).reshape(batch_size * h, q_length, d)
        key_layer = fused_qkv[..., 1, :].permute(0, 2, 3, 1).reshape(batch_size * h, d, q_length)
        value_layer = fused_qkv[..., 2, :].transpose(1, 2).reshape(batch_size * h, q_length, d)
        positions = torch.arange(q_length, dtype=hidden_states.dtype).expand(batch_size, q_length)
        alibi = self.slopes[None, :, None] * positions[:, None, :]  # [B, h, S]
        if self.bug == "bias_constant":
            alibi = alibi.reshape(batch_size * h, q_length, 1)  # <- bias_constant
        else:
            alibi = alibi.reshape(batch_size * h, 1, q_length)
        matmul_result = alibi.baddbmm(  # <- bias_constant
            batch1=query_layer, batch2=key_layer, beta=1.0, alpha=self.inv_norm_factor
        )
        attention_scores = matmul_result.view(batch_size, h, q_length, q_length)
        causal_mask = torch.ones(q_length, q_length, dtype=torch.bool).triu(1)
        attention_scores = attention_scores.masked_fill(causal_mask, float("-inf"))
        attention_probs = F.softmax(attention_scores, dim=-1)
        attention_probs = attention_probs.view(batch_size * h, q_length, q_length)
        context_layer = torch.bmm(attention_probs, value_layer)
        context_layer = context_layer.view(batch_size, h, q_length, d).permute(0, 2, 1, 3)
        return self.dense(context_layer.reshape(batch_size, q_length, h * d))


# -- T5: relative-position buckets -------------------------------------------------------
def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
    """T5's bidirectional bucket: exact for small distances, logarithmic beyond."""
    num_buckets //= 2
    relative_buckets = (relative_position > 0).to(torch.long) * num_buckets
    relative_position = torch.abs(relative_position)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    relative_position_if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    relative_position_if_large = torch.min(
        relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
    )
    return relative_buckets + torch.where(is_small, relative_position, relative_position_if_large)


class T5Attention(nn.Module):
    """T5's self-attention: no scaling, a learned bias per (relative-position bucket, head)."""

    def __init__(self, d_model, n_heads, num_buckets=32):
        super().__init__()
        self.n_heads, self.key_value_proj_dim = n_heads, d_model // n_heads
        self.inner_dim = d_model
        self.q = nn.Linear(d_model, d_model, bias=False)
        self.k = nn.Linear(d_model, d_model, bias=False)
        self.v = nn.Linear(d_model, d_model, bias=False)
        self.o = nn.Linear(d_model, d_model, bias=False)
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def compute_bias(self, query_length, key_length):
        context_position = torch.arange(query_length, dtype=torch.long)[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long)[None, :]
        relative_position = memory_position - context_position  # [S_q, S_k]
        buckets = relative_position_bucket(relative_position)
        values = self.relative_attention_bias(buckets)  # [S_q, S_k, h]
        return values.permute([2, 0, 1]).unsqueeze(0)  # [1, h, S_q, S_k]

    def forward(self, hidden_states):
        batch_size, seq_length = hidden_states.shape[:2]
        shape = (batch_size, -1, self.n_heads, self.key_value_proj_dim)
        query_states = self.q(hidden_states).view(shape).transpose(1, 2)
        key_states = self.k(hidden_states).view(shape).transpose(1, 2)
        value_states = self.v(hidden_states).view(shape).transpose(1, 2)
        scores = torch.matmul(query_states, key_states.transpose(3, 2))
        scores = scores + self.compute_bias(seq_length, seq_length)
        attn_weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous().view(batch_size, -1, self.inner_dim)
        return self.o(attn_output)


# -- einsum / einops ---------------------------------------------------------------------
class EinopsAttention(nn.Module):
    """Attention written with einops.rearrange and torch.einsum; attention_mask is
    [batch, seq] with 1 for real tokens."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.scale, self.bug = n_heads, (d_model // n_heads) ** -0.5, bug
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask=None):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b s (h d) -> b h s d", h=self.n_heads) for t in (q, k, v))
        if self.bug == "contraction":
            scores = torch.einsum("bhqd,bhdk->bhqk", q, k) * self.scale  # <- contraction
        else:
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.scale
        if attention_mask is not None:
            bug = self.bug == "mask_axis"
            pattern = "b i -> b 1 i 1" if bug else "b j -> b 1 1 j"  # <- mask_axis
            keep = rearrange(attention_mask.bool(), pattern)  # <- mask_axis
            scores = scores.masked_fill(~keep, float("-inf"))  # <- mask_axis
        attn = scores.softmax(dim=2 if self.bug == "softmax_axis" else -1)  # <- softmax_axis
        out = torch.einsum("bhqk,bhkd->bhqd", attn, v)
        return self.to_out(rearrange(out, "b h s d -> b s (h d)"))


class EinopsFolded(nn.Module):
    """einops attention on torch.bmm: heads folded into the batch, (b h), and unfolded."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.scale, self.bug = n_heads, (d_model // n_heads) ** -0.5, bug
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x):
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b s (h d) -> (b h) s d", h=self.n_heads) for t in (q, k, v))
        attn = (torch.bmm(q, k.transpose(1, 2)) * self.scale).softmax(dim=-1)
        out = torch.bmm(attn, v)
        if self.bug == "fold_order":
            out = rearrange(out, "(h b) s d -> b s (h d)", h=self.n_heads)  # <- fold_order
        else:
            out = rearrange(out, "(b h) s d -> b s (h d)", h=self.n_heads)
        return self.to_out(out)


# -- nn.MultiheadAttention in user modules -----------------------------------------------
class MHAEncoder(nn.Module):
    """A user's encoder block on nn.MultiheadAttention; x is [batch, seq, d_model] and
    attention_mask [batch, seq] with 1 for real tokens. Learned positions are added along
    the sequence axis first. Built with batch_first=False, the block transposes to the
    module's [seq, batch, d_model] and back."""

    def __init__(self, d_model, n_heads, batch_first=True, bug=None, max_len=128):
        super().__init__()
        self.bug = bug
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=batch_first)

    def forward(self, x, attention_mask=None):
        x = x + self.pos(torch.arange(x.shape[1], device=x.device))
        pad = None  # key_padding_mask hides the keys where it is True
        if attention_mask is not None:
            bug = self.bug == "mask_polarity"
            pad = attention_mask.bool() if bug else attention_mask == 0  # <- mask_polarity
        if self.attn.batch_first or self.bug == "mha_batch_first":
            context, _ = self.attn(  # <- mha_batch_first, mask_polarity
                x, x, x, key_padding_mask=pad, need_weights=False
            )
        else:
            x_t = x.transpose(0, 1)
            context, _ = self.attn(x_t, x_t, x_t, key_padding_mask=pad, need_weights=False)
            context = context.transpose(0, 1)
        return x + context


class TorchEncoder(nn.Module):
    """PyTorch's own nn.TransformerEncoderLayer in a user's model; x is [batch, seq, d_model],
    with learned positions added along seq first."""

    def __init__(self, d_model, n_heads, batch_first=True, bug=None, max_len=128):
        super().__init__()
        self.bug = bug
        self.pos = nn.Embedding(max_len, d_model)
        self.layer = nn.TransformerEncoderLayer(
            d_model, n_heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=batch_first
        )

    def forward(self, x):
        x = x + self.pos(torch.arange(x.shape[1], device=x.device))
        if self.layer.self_attn.batch_first or self.bug == "mha_batch_first":
            return self.layer(x)  # <- mha_batch_first
        return self.layer(x.transpose(0, 1)).transpose(0, 1)


class SeqFirstEncoder(nn.Module):
    """Legacy seq-first code (the old nn.Transformer tutorial): x is [seq, batch, d_model]
    all the way, handed to modules built with the default batch_first=False. With
    `positions` a sinusoidal table is added along axis 0 (`pe[:x.size(0)]`) or learned
    positions of arange along axis 0."""

    def __init__(self, d_model, n_heads, positions=None, max_len=128, torch_layer=False):
        super().__init__()
        self.positions = positions
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div)
        pe[:, 0, 1::2] = torch.cos(position * div)[:, : d_model // 2]
        self.register_buffer("pe", pe)
        self.pos = nn.Embedding(max_len, d_model)
        if torch_layer:
            self.layer = nn.TransformerEncoderLayer(d_model, n_heads, 2 * d_model, dropout=0.0)
            self.attn = None
        else:
            self.layer = None
            self.attn = nn.MultiheadAttention(d_model, n_heads)

    def forward(self, x, src_key_padding_mask=None):
        if self.positions == "sinusoidal":
            x = x + self.pe[: x.size(0)]
        elif self.positions == "learned":
            x = x + self.pos(torch.arange(x.size(0), device=x.device))[:, None]
        if self.layer is not None:
            return self.layer(x, src_key_padding_mask=src_key_padding_mask)
        context, _ = self.attn(x, x, x, key_padding_mask=src_key_padding_mask, need_weights=False)
        return x + context


class SeqFirstFolded(nn.Module):
    """fairseq's and F.multi_head_attention_forward's style: x is [tgt_len, bsz, embed],
    heads folded into the batch by `view(tgt_len, bsz * heads, head_dim)` then moved
    first; key_padding_mask is [bsz, src_len] with True for padding."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.num_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, key_padding_mask=None):
        tgt_len, bsz, embed_dim = x.size()
        q = self.q_proj(x) * self.head_dim**-0.5
        k, v = self.k_proj(x), self.v_proj(x)
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            hidden = key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool)
            attn_weights = attn_weights.masked_fill(hidden, float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_probs = F.softmax(attn_weights, dim=-1)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn)


class MHAPerExampleMask(nn.Module):
    """nn.MultiheadAttention with a per-example mask (causal and padding, [B, S, S], True =
    hidden), which it takes as [B * h, S, S] with the h copies of each example adjacent."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)

    def forward(self, x, attention_mask):
        B, S, _ = x.shape
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        hide = future | (attention_mask == 0)[:, None, :]  # [B, S_q, S_k]
        if self.bug == "mask_repeat":
            hide = hide.repeat(self.n_heads, 1, 1)  # <- mask_repeat
        else:
            hide = hide.repeat_interleave(self.n_heads, dim=0)  # [B * h, S_q, S_k]
        out, _ = self.attn(x, x, x, attn_mask=hide, need_weights=False)  # <- mask_repeat
        return out


class EinopsMHAMask(nn.Module):
    """The same per-example mask for a seq-first nn.MultiheadAttention, repeated with einops."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.attn = nn.MultiheadAttention(d_model, n_heads)

    def forward(self, x, attention_mask):
        S = x.shape[1]
        future = torch.ones(S, S, dtype=torch.bool).triu(1)
        hide = future | rearrange(attention_mask == 0, "b j -> b 1 j")
        if self.bug == "mask_repeat":
            hide = einops.repeat(hide, "b i j -> (h b) i j", h=self.n_heads)  # <- mask_repeat
        else:
            hide = einops.repeat(hide, "b i j -> (b h) i j", h=self.n_heads)
        x_t = rearrange(x, "b s e -> s b e")
        out, _ = self.attn(x_t, x_t, x_t, attn_mask=hide, need_weights=False)  # <- mask_repeat
        return rearrange(out, "s b e -> b s e")


class EinopsMaskedFold(nn.Module):
    """stable-diffusion's CrossAttention on self-attention: heads folded into the batch with
    einops, (b h), and a [batch, seq] padding mask tiled to match with einops' repeat."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.scale, self.bug = n_heads, (d_model // n_heads) ** -0.5, bug
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask):
        h = self.n_heads
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=h) for t in (q, k, v))
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        if self.bug == "mask_repeat":
            keep = einops.repeat(attention_mask.bool(), "b j -> (h b) () j", h=h)  # <- mask_repeat
        else:
            keep = einops.repeat(attention_mask.bool(), "b j -> (b h) () j", h=h)
        sim = sim.masked_fill(~keep, float("-inf"))  # <- mask_repeat
        out = torch.einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)
        return self.to_out(rearrange(out, "(b h) n d -> b n (h d)", h=h))


class BmmMaskedFold(nn.Module):
    """fairseq-style attention on torch.bmm: [batch * heads, seq, d_k] batch-major, and a
    [batch, 1, seq] padding mask tiled to match before masked_fill."""

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask):
        B, S, D = x.shape
        h, d_k = self.n_heads, D // self.n_heads
        q, k, v = (
            t.view(B, S, h, d_k).transpose(1, 2).reshape(B * h, S, d_k)
            for t in self.to_qkv(x).chunk(3, dim=-1)
        )
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(d_k)
        hidden = (attention_mask == 0)[:, None, :]  # [B, 1, S]
        if self.bug == "mask_repeat":
            hidden = hidden.repeat(self.n_heads, 1, 1)  # <- mask_repeat
        else:
            hidden = hidden.repeat_interleave(self.n_heads, dim=0)
        scores = scores.masked_fill(hidden, float("-inf"))  # <- mask_repeat
        out = torch.bmm(scores.softmax(dim=-1), v).view(B, h, S, d_k)
        return self.to_out(out.transpose(1, 2).reshape(B, S, D))


# -- ViT patch embedding -----------------------------------------------------------------
class PatchEmbed(nn.Module):
    """ViT's patch embedding, [B, C, H, W] images -> [B, num_patches, d_model] tokens, each
    patch flattened as (C, p, p). style: "reshape" and "split" flatten with reshapes, "unfold"
    with F.unfold, "einops" with rearrange, "conv" is timm's Conv2d(kernel=stride=p)."""

    def __init__(self, in_chans, patch_size, d_model, style="split", bug=None):
        super().__init__()
        self.patch_size, self.style, self.bug = patch_size, style, bug
        if style == "conv":
            self.proj = nn.Conv2d(in_chans, d_model, kernel_size=patch_size, stride=patch_size)
        else:
            self.proj = nn.Linear(in_chans * patch_size * patch_size, d_model)

    def forward(self, x):
        B, C, H, W = x.shape
        p = self.patch_size
        if self.style == "conv":
            return self.proj(x).flatten(2).transpose(1, 2)  # [B, d, H/p, W/p] -> [B, N, d]
        if self.style == "einops":
            patches = rearrange(x, "b c (h p1) (w p2) -> b (h w) (c p1 p2)", p1=p, p2=p)
        elif self.style == "unfold":
            cols = F.unfold(x, kernel_size=p, stride=p)  # [B, C * p * p, N]
            if self.bug == "patchify":
                patches = cols.reshape(B, -1, C * p * p)  # <- patchify
            else:
                patches = cols.transpose(1, 2)
        elif self.style == "reshape":
            if self.bug == "patchify":
                patches = x.reshape(B, -1, C * p * p)  # <- patchify
            else:
                patches = x.unflatten(3, (W // p, p)).unflatten(2, (H // p, p))
                patches = patches.permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
        else:
            grid = x.reshape(B, C, H // p, p, W // p, p)
            if self.bug == "patchify":
                patches = grid.reshape(B, -1, C * p * p)  # <- patchify
            else:
                patches = grid.permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
        return self.proj(patches)


# -- joint text-image attention -----------------------------------------------------------
class JointHeads(nn.Module):
    """SD3/Flux-style joint attention: image patches (a strided conv) and text tokens, each
    with its own query, key and value projections, attended as one sequence, text first.
    layout "bshd" concatenates [B, L, heads, d_k], "bhsd" after the heads transpose."""

    def __init__(self, channels, patch, d_model, heads, layout="bshd", bug=None):
        super().__init__()
        self.heads, self.d_k, self.layout, self.bug = heads, d_model // heads, layout, bug
        self.patches = nn.Conv2d(channels, d_model, kernel_size=patch, stride=patch)
        self.img_qkv, self.txt_qkv = (
            nn.Linear(d_model, 3 * d_model),
            nn.Linear(d_model, 3 * d_model),
        )
        self.out = nn.Linear(d_model, d_model)

    def split(self, qkv):
        B, L, _ = qkv.shape
        parts = qkv.view(B, L, 3, self.heads, self.d_k).unbind(2)  # 3 x [B, L, heads, d_k]
        return parts if self.layout == "bshd" else [t.transpose(1, 2) for t in parts]

    def forward(self, img, txt):
        x = self.patches(img).flatten(2).transpose(1, 2)  # [B, N, d_model]
        image, text = self.split(self.img_qkv(x)), self.split(self.txt_qkv(txt))
        tokens = 1 if self.layout == "bshd" else 2
        heads = 3 - tokens
        axis = heads if self.bug == "cat_axis" else tokens
        (qt, kt, vt), (qi, ki, vi) = text, image
        q = torch.cat((qt, qi), dim=axis)  # <- cat_axis
        k = torch.cat((kt, ki), dim=axis)  # <- cat_axis
        v = torch.cat((vt, vi), dim=axis)  # <- cat_axis
        if self.layout == "bshd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, heads, S + N, d_k]
        B = out.shape[0]
        return self.out(out.transpose(1, 2).reshape(B, -1, self.heads * self.d_k))


# -- softmaxes that are not attention ----------------------------------------------------
class MoEBlock(nn.Module):
    """A transformer block: attention, then a mixture of experts whose router softmax runs
    over the experts of each token ([tokens, n_experts], a Linear's output), top-2 kept."""

    def __init__(self, hidden_size, num_heads, num_key_value_heads, num_experts):
        super().__init__()
        self.top_k = min(2, num_experts)
        self.attn = HFAttention(hidden_size, num_heads, num_key_value_heads, "sdpa")
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(
                nn.Linear(hidden_size, 2 * hidden_size),
                nn.GELU(),
                nn.Linear(2 * hidden_size, hidden_size),
            )
            for _ in range(num_experts)
        )

    def forward(self, x):
        h = x + self.attn(x)
        tokens = h.reshape(-1, h.shape[-1])  # [B * S, hidden]
        router_probs = F.softmax(self.gate(tokens), dim=-1)  # [tokens, n_experts]
        weights, chosen = router_probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(router_probs).scatter(-1, chosen, weights)
        expert_out = torch.stack([expert(tokens) for expert in self.experts], dim=1)
        mixed = torch.einsum("te,teh->th", gates, expert_out)
        return h + mixed.view_as(h)


class TokenClassifier(nn.Module):
    """A tagger: tutorial attention, then a softmax over n_tags per token ([B, S, n_tags])."""

    def __init__(self, d_model, n_heads, n_tags):
        super().__init__()
        self.encoder = TutorialMHA(d_model, n_heads)
        self.head = nn.Linear(d_model, n_tags)

    def forward(self, x, attention_mask):
        logits = self.head(self.encoder(x, attention_mask))  # [B, S, n_tags]
        return F.softmax(logits, dim=-1)
