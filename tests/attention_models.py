"""Small attention modules for the core tests, correct unless a `bug` is named.

Sizes are pairwise distinct everywhere (batch 2, heads 3, seq_q 5, seq_k 7, d_k 11,
d_model 33), so a swapped axis cannot pass by coincidence.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

B, H, SQ, SK, DK = 2, 3, 5, 7, 11
D = H * DK  # 33


class HandAttention(nn.Module):
    """The tutorial's multi-head attention, with one optional bug."""

    def __init__(self, d_model=D, n_heads=H, bug=None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.bug = bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        batch, seq, _ = x.shape
        Q = self.W_q(x).view(batch, -1, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(batch, -1, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(batch, -1, self.n_heads, self.d_k).transpose(1, 2)
        if self.bug == "k_not_transposed":
            scores = torch.matmul(Q, K) / math.sqrt(self.d_k)
        else:
            scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        attn = F.softmax(scores, dim=2 if self.bug == "softmax_axis" else -1)
        context = torch.matmul(attn, V).transpose(1, 2)
        if self.bug != "view_after_transpose":
            context = context.contiguous()
        context = context.view(batch, -1, self.d_model)
        return self.out(context)


class CrossAttention(nn.Module):
    """Queries from x [batch, seq_q, d_model], keys/values from memory [batch, seq_k, d_model]."""

    def __init__(self, d_model=D, n_heads=H, d_memory=D, bug=None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.bug = bug
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_memory if bug != "wrong_linear_width" else d_memory + 4, d_model)
        self.v_proj = nn.Linear(d_memory, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x, memory, memory_mask=None):
        batch, seq_q, _ = x.shape
        seq_k = memory.shape[1]
        q = self.q_proj(x).view(batch, seq_q, self.n_heads, self.d_k).transpose(1, 2)
        k = self.k_proj(memory).view(batch, seq_k, self.n_heads, self.d_k).transpose(1, 2)
        v = self.v_proj(memory).view(batch, seq_k, self.n_heads, self.d_k).transpose(1, 2)
        if self.bug == "kv_seq":
            v = v[:, :, :-1]
        mask = memory_mask
        if mask is not None and self.bug != "padding_mask_unexpanded":
            mask = mask[:, None, None, :]
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        context = context.transpose(1, 2).reshape(batch, seq_q, self.d_model)
        return self.o_proj(context)


class CausalSelfAttention(nn.Module):
    """nanoGPT-style: one c_attn projection, split, causal mask buffer sliced to T."""

    def __init__(self, n_embd=D, n_head=H, block_size=13):
        super().__init__()
        self.n_embd = n_embd
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size),
        )

    def forward(self, x):
        B_, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B_, T, C)
        return self.c_proj(y)


class GQAttention(nn.Module):
    """Grouped-query attention: 6 query heads share 3 kv heads (repeat_kv)."""

    def __init__(self, hidden_size=66, num_heads=6, num_key_value_heads=3, bug=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_heads
        self.bug = bug
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        query_states = (
            self.q_proj(hidden_states)
            .view(bsz, q_len, self.num_heads, self.head_dim)
            .transpose(1, 2)
        )
        key_states = (
            self.k_proj(hidden_states)
            .view(bsz, q_len, self.num_key_value_heads, self.head_dim)
            .transpose(1, 2)
        )
        value_states = (
            self.v_proj(hidden_states)
            .view(bsz, q_len, self.num_key_value_heads, self.head_dim)
            .transpose(1, 2)
        )
        groups = self.num_heads // self.num_key_value_heads
        if self.bug != "no_repeat_kv":
            key_states = key_states.repeat_interleave(groups, dim=1)
            value_states = value_states.repeat_interleave(groups, dim=1)
        scores = query_states @ key_states.transpose(-2, -1) / math.sqrt(self.head_dim)
        attn_weights = scores.softmax(dim=-1)
        attn_output = attn_weights @ value_states
        attn_output = attn_output.transpose(1, 2).reshape(bsz, q_len, self.hidden_size)
        return self.o_proj(attn_output)


class SDPAGQA(nn.Module):
    """GQA through SDPA's enable_gqa."""

    def __init__(self, hidden_size=66, num_heads=6, num_key_value_heads=3):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim)
        self.kv_proj = nn.Linear(hidden_size, 2 * num_key_value_heads * self.head_dim)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = (
            self.kv_proj(x)
            .view(bsz, seq, 2 * self.num_key_value_heads, self.head_dim)
            .transpose(1, 2)
            .chunk(2, dim=1)
        )
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, self.hidden_size))
