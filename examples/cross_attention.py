"""Cross-attention: queries from a decoder, keys and values from an encoder's memory.

The one place where seq_q != seq_k, so the scores are [batch, heads, seq_q, seq_k]
and the mask hides padded memory positions, [batch, 1, 1, seq_k]. Run it to
see both sequence axes named apart:

    python examples/cross_attention.py
"""
# shapeguard: expect exit 0

import math

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


@shapeguard.guard
class CrossAttention(nn.Module):
    def __init__(self, d_model=48, n_heads=4):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, memory, memory_keep=None):
        B, T_q, _ = x.shape  # the decoder's tokens
        T_k = memory.size(1)  # the encoder's tokens
        H, d_k = self.n_heads, self.d_k
        Q = self.W_q(x).view(B, T_q, H, d_k).transpose(1, 2)  # [B, H, T_q, d_k]
        K = self.W_k(memory).view(B, T_k, H, d_k).transpose(1, 2)  # [B, H, T_k, d_k]
        V = self.W_v(memory).view(B, T_k, H, d_k).transpose(1, 2)  # [B, H, T_k, d_k]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T_q, T_k]
        if memory_keep is not None:  # [B, T_k], True for real memory tokens
            scores = scores.masked_fill(~memory_keep[:, None, None, :], float("-inf"))
        attn = F.softmax(scores, dim=-1)  # each query's weights over the T_k keys
        context = (attn @ V).transpose(1, 2).reshape(B, T_q, self.d_model)  # [B, T_q, d_model]
        return self.out(context)


def build_model():
    return CrossAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq_q=5, seq_k=9, d_model=48):
    x = torch.randn(batch, seq_q, d_model)
    memory = torch.randn(batch, seq_k, d_model)
    lengths = torch.tensor([seq_k, seq_k - 3])
    memory_keep = torch.arange(seq_k)[None, :] < lengths[:, None]  # [batch, seq_k]
    return (x, memory), {"memory_keep": memory_keep}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
