"""Small models for the diff tests: a hand-written attention with its reference's
parameter names, a port of it with other names, and one with the scale taken from
d_model instead of head_dim (a difference that keeps every shape)."""

import math

import torch
from torch import nn


class Attention(nn.Module):
    """Reference: q_proj, k_proj, v_proj, o_proj; softmax(q k^T / sqrt(d_k)) v."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        attn = scores.softmax(dim=-1)  # REF_SOFTMAX
        context = attn @ v
        return self.o_proj(context.transpose(1, 2).reshape(B, T, C))


class Port(nn.Module):
    """A port with its own names (wq, wk, wv, wo); `scale_from_d_model` is the bug."""

    def __init__(self, d_model: int, heads: int, scale_from_d_model: bool = False):
        super().__init__()
        self.heads, self.d_k, self.d_model = heads, d_model // heads, d_model
        self.scale_from_d_model = scale_from_d_model
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        k = self.wk(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        v = self.wv(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        d = self.d_model if self.scale_from_d_model else self.d_k
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        weights = torch.softmax(scores, dim=-1)  # PORT_SOFTMAX
        out = torch.matmul(weights, v)
        return self.wo(out.transpose(1, 2).reshape(B, T, C))


MAPPING = {
    f"{r}.{p}": f"{w}.{p}"
    for r, w in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("o_proj", "wo"))
    for p in ("weight", "bias")
}


class SdpaAttention(Attention):
    """The reference's math through F.scaled_dot_product_attention."""

    def forward(self, x):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        context = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o_proj(context.transpose(1, 2).reshape(B, T, C))


class Switchable(Attention):
    """The reference with transformers' switch of implementation (`config`,
    `set_attn_implementation`): "eager" and "sdpa" compute the same attention, "d_model"
    scales by 1/sqrt(d_model) (a backend that differs, for the tests of three or more)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__(d_model, heads)
        from types import SimpleNamespace

        self.config = SimpleNamespace(_attn_implementation="eager")

    def set_attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = name

    def forward(self, x):
        B, T, C = x.shape
        impl = self.config._attn_implementation
        q = self.q_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.heads, self.d_k).transpose(1, 2)
        if impl == "sdpa":
            context = nn.functional.scaled_dot_product_attention(q, k, v)
        else:
            d = C if impl == "d_model" else self.d_k
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)
            context = scores.softmax(dim=-1) @ v
        return self.o_proj(context.transpose(1, 2).reshape(B, T, C))
