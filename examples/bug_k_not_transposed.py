"""Bug: K not transposed, so the scores multiply Q by K instead of by K^T.

`Q @ K` pairs each query's d_k features with the keys' sequence axis. torch
raises `Expected size for first two dimensions of batch2 tensor to be: [8, 12]
but got: [8, 7]` (the batch and heads flattened together) and names no tensor;
shapeguard names Q and K, their axes, and the transpose that is missing.

    python examples/bug_k_not_transposed.py

shapeguard says:

    shapeguard.ShapeError: scores = Q @ K: Q.d_k (12) != K.seq (7)
      in  SelfAttention at examples/bug_k_not_transposed.py:49
          scores = Q @ K / math.sqrt(d_k)  # BUG: K is [B, H, T, d_k], not K^T
      Q      [batch=2, heads=4, seq=7, d_k=12] float32
      K      [batch=2, heads=4, seq=7, d_k=12] float32
      hint: K was not transposed: use Q @ K.transpose(-2, -1)

The fix: `scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)`.
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
        scores = Q @ K / math.sqrt(d_k)  # BUG: K is [B, H, T, d_k], not K^T
        attn = F.softmax(scores, dim=-1)  # [B, H, T, T]
        context = (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)
        return self.out(context)


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
