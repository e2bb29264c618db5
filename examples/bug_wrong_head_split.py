"""Bug: heads carved out of the sequence axis: `view(B, H, T, d_k)` with no transpose.

The projection is [B, T, d_model]. Viewing it directly as [B, H, T, d_k] has
the right shape and raises nothing, but each "head" is now a block of T/H
consecutive tokens' features, and tokens are mixed across heads: attention
runs, and computes the wrong thing. shapeguard sees that the view regroups
the seq axis with the feature axis.

    python examples/bug_wrong_head_split.py

shapeguard says:

    shapeguard.ShapeWarning: W_q(x).view(2, 4, 7, 12): carves heads out of the seq axis: regroups [seq=7, d_model=48] as [4, 7, 12]
      in  SelfAttention at examples/bug_wrong_head_split.py:59
          Q = self.W_q(x).view(B, H, T, d_k)  # BUG: [B, T, d_model] is not [B, H, T, d_k]
      W_q(x)  [batch=2, seq=7, d_model=48] float32
      hint: split heads out of the feature axis, then move them: use W_q(x).view(batch, seq, heads, d_k).transpose(1, 2), i.e. view(2, 7, 4, 12).transpose(1, 2)

    shapeguard.ShapeWarning: W_k(x).view(2, 4, 7, 12): carves heads out of the seq axis: regroups [seq=7, d_model=48] as [4, 7, 12]
      in  SelfAttention at examples/bug_wrong_head_split.py:60
          K = self.W_k(x).view(B, H, T, d_k)
      W_k(x)  [batch=2, seq=7, d_model=48] float32
      hint: split heads out of the feature axis, then move them: use W_k(x).view(batch, seq, heads, d_k).transpose(1, 2), i.e. view(2, 7, 4, 12).transpose(1, 2)

    shapeguard.ShapeWarning: W_v(x).view(2, 4, 7, 12): carves heads out of the seq axis: regroups [seq=7, d_model=48] as [4, 7, 12]
      in  SelfAttention at examples/bug_wrong_head_split.py:61
          V = self.W_v(x).view(B, H, T, d_k)
      W_v(x)  [batch=2, seq=7, d_model=48] float32
      hint: split heads out of the feature axis, then move them: use W_v(x).view(batch, seq, heads, d_k).transpose(1, 2), i.e. view(2, 7, 4, 12).transpose(1, 2)

The fix: split the features, then move the heads:
`self.W_q(x).view(B, T, H, d_k).transpose(1, 2)`.
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
        Q = self.W_q(x).view(B, H, T, d_k)  # BUG: [B, T, d_model] is not [B, H, T, d_k]
        K = self.W_k(x).view(B, H, T, d_k)
        V = self.W_v(x).view(B, H, T, d_k)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T, T]
        attn = F.softmax(scores, dim=-1)
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
