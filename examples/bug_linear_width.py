"""Bug: an nn.Linear built for the wrong width (the output projection sized per head).

The heads are merged back into [B, T, d_model] features, but the output
projection was built as `nn.Linear(d_k, d_model)`, as if it ran per head.
torch says `mat1 and mat2 shapes cannot be multiplied (14x48 and 12x48)`: mat1
is the context with its leading axes flattened (2 * 7 = 14 rows), mat2 the
transposed weight. shapeguard names the layer, the tensor and the feature axis.

    python examples/bug_linear_width.py

shapeguard says:

    shapeguard.ShapeError: out = Linear(in_features=12) got context with heads*d_k=48
      in  out (Linear) at examples/bug_linear_width.py:53
          return self.out(context)
      context  [batch=2, seq_q=7, heads*d_k=48] float32
      out      Linear(in_features=12, out_features=48)
      hint: context has 48 features, out expects 12: build out as nn.Linear(48, 48), or fix what produced context. torch would say: mat1 and mat2 shapes cannot be multiplied (14x48 and 12x48) (mat1 rows = 2 * 7, the leading axes of context flattened)

The fix: `self.out = nn.Linear(d_model, d_model)`.
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
        self.out = nn.Linear(self.d_k, d_model)  # BUG: the merged heads have d_model features

    def forward(self, x):
        B, T, _ = x.shape
        H, d_k = self.n_heads, self.d_k
        Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T, T]
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)  # [B, T, d_model]
        return self.out(context)


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
