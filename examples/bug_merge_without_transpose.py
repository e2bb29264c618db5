"""Bug: heads merged back with `reshape(B, T, d_model)` without moving them next to d_k.

The context is [B, H, T, d_k]. Reshaping it straight to [B, T, d_model] keeps
the shape right and raises nothing, but each output token now holds pieces of
several tokens of one head instead of every head's view of one token.
shapeguard sees the reshape regroup the heads axis with the seq axis.

    python examples/bug_merge_without_transpose.py

shapeguard says:

    shapeguard.ShapeWarning: context.reshape(2, 7, 48): merges heads back before moving them next to d_k: regroups [heads=4, seq_q=7, d_k=12] as [7, 48], so each output token holds pieces of other tokens
      in  SelfAttention at examples/bug_merge_without_transpose.py:51
          context = context.reshape(B, T, self.d_model)  # BUG: heads are still axis 1
      context  [batch=2, heads=4, seq_q=7, d_k=12] float32
      hint: transpose first: context.transpose(1, 2).contiguous().view(batch, seq, heads * d_k), i.e. .transpose(1, 2).reshape(2, 7, 48)

The fix: `context.transpose(1, 2).reshape(B, T, d_model)`.
"""
# shapeguard: expect exit 1

import math

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class SelfAttention(nn.Module):
    def __init__(self, d_model=48, n_heads=4):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        H, d_k = self.n_heads, self.d_k
        Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T, T]
        attn = F.softmax(scores, dim=-1)
        context = attn @ V  # [B, H, T, d_k]
        context = context.reshape(B, T, self.d_model)  # BUG: heads are still axis 1
        return self.out(context)


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
