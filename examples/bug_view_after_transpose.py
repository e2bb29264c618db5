"""Bug: `view` on the transposed context when merging the heads back.

`transpose(1, 2)` only swaps strides; the data stays in [B, H, T, d_k] order,
so `view` cannot merge heads and d_k without a copy. torch says `view size is
not compatible with input tensor's size and stride (at least one dimension
spans across two contiguous subspaces)`; shapeguard says which tensor, which
op made it non-contiguous and which axes view could not merge.

    python examples/bug_view_after_transpose.py

shapeguard says:

    shapeguard.ShapeError: context.view(2, 7, 48): context is not contiguous (it comes from transpose) and view cannot merge heads and d_k
      in  SelfAttention at examples/bug_view_after_transpose.py:52
          context = context.view(B, T, self.d_model)  # BUG: needs .contiguous() first
      context  [batch=2, seq_q=7, heads=4, d_k=12] float32
      hint: use context.contiguous().view(...) or context.reshape(...)

The fix: `.transpose(1, 2).contiguous().view(B, T, d_model)`, or `.reshape(...)`.
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
        context = (attn @ V).transpose(1, 2)  # [B, T, H, d_k], not contiguous
        context = context.view(B, T, self.d_model)  # BUG: needs .contiguous() first
        return self.out(context)


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
