"""Bug: a causal mask with the wrong polarity: it hides the past and shows the future.

`torch.triu(ones)` is True on and above the diagonal, the future. Used as a
keep-mask (`masked_fill(mask == 0, -inf)`), it lets each token see every later
token and hides the earlier ones: a language model trained this way learns to
copy the next token and fails at generation. Shapes are all correct; nothing
raises.

    python examples/bug_causal_leak.py

shapeguard says:

    shapeguard.ShapeWarning: masked_fill: causal_mask == 0 hides the past instead of the future: each query sees itself and later keys only
      in  CausalSelfAttention at examples/bug_causal_leak.py:52
          scores = scores.masked_fill(causal_mask == 0, float("-inf"))
      causal_mask == 0  [7, 7] bool
      hint: tril and triu are swapped: a causal mask hides key j from query i when j > i, e.g. torch.ones(seq, seq, dtype=torch.bool).triu(1) marks the positions to hide

The fix: keep the past, `mask = torch.tril(torch.ones(T, T, dtype=torch.bool))`, or
pass `is_causal=True` to `F.scaled_dot_product_attention`.
"""
# shapeguard: expect exit 1

import math

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class CausalSelfAttention(nn.Module):
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
        causal_mask = torch.triu(torch.ones(T, T, dtype=torch.bool))  # BUG: the future
        scores = scores.masked_fill(causal_mask == 0, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)
        return self.out(context)


def build_model():
    return CausalSelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
