"""Grouped-query attention with rotary position embeddings (RoPE), Llama style.

8 query heads share 2 key/value heads (each kv head serves a group of 4), and
Q and K are rotated by position before the scores. The kv heads are repeated
to match the query heads, then SDPA runs with a causal mask. Run it to see
kv_heads and heads named apart:

    python examples/gqa_rope.py
"""
# shapeguard: expect exit 0

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x, cos, sin):
    """Rotate [B, H, T, d_k] by position; cos and sin are [T, d_k]."""
    return x * cos + rotate_half(x) * sin


@shapeguard.guard
class GQAttention(nn.Module):
    def __init__(self, d_model=64, n_heads=8, n_kv_heads=2, max_seq=32, base=10000.0):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError("need d_model % n_heads == 0 and n_heads % n_kv_heads == 0")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = d_model // n_heads
        self.W_q = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.W_k = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.W_v = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(n_heads * self.head_dim, d_model, bias=False)
        inv_freq = 1.0 / base ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim)
        angles = torch.outer(torch.arange(max_seq).float(), inv_freq)  # [max_seq, d_k / 2]
        angles = torch.cat((angles, angles), dim=-1)  # [max_seq, d_k]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        H, H_kv, d_k = self.n_heads, self.n_kv_heads, self.head_dim
        q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        k = self.W_k(x).view(B, T, H_kv, d_k).transpose(1, 2)  # [B, H_kv, T, d_k]
        v = self.W_v(x).view(B, T, H_kv, d_k).transpose(1, 2)  # [B, H_kv, T, d_k]
        cos, sin = self.cos[:T], self.sin[:T]  # [T, d_k]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = k.repeat_interleave(H // H_kv, dim=1)  # [B, H, T, d_k]
        v = v.repeat_interleave(H // H_kv, dim=1)  # [B, H, T, d_k]
        context = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d_k]
        context = context.transpose(1, 2).reshape(B, T, H * d_k)  # [B, T, d_model]
        return self.out(context)


def build_model():
    return GQAttention(d_model=64, n_heads=8, n_kv_heads=2)


def example_inputs(batch=3, seq=11, d_model=64):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
