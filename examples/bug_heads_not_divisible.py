"""Bug: d_model not divisible by n_heads (the tutorial's d_model=512, n_heads=6).

`d_k = d_model // n_heads` rounds 85.33 down to 85, so six heads of 85 cover
510 of the 512 features and the head split cannot work. The tutorial guards
this with `assert d_model % n_heads == 0`, which `python -O` removes; here the
assert is gone and torch says `shape '[2, -1, 6, 85]' is invalid for input of
size 7168`. shapeguard names the two sizes and lists the head counts that work,
when the trace first enters the module (it declares d_model and n_heads and
projects to d_model features, so it must split them into heads), before its
first op; the message points at the call that entered it (below, the docs test
harness's `shapeguard.trace(model, ...)`). With `@shapeguard.guard` on the class
the same check runs when the model is built.

    python examples/bug_heads_not_divisible.py

shapeguard says:

    shapeguard.ShapeError: d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in MultiHeadAttention
      in  MultiHeadAttention at tests/_docs_support.py:68
          shapeguard.trace(model, *args, **kwargs)
      hint: head counts that work for d_model=512: 1, 2, 4, 8, 16, 32, 64, 128, 256; or pick d_model as a multiple of n_heads (e.g. 510)

The fix: pick n_heads from the list above (8 for d_model=512), or d_model as a
multiple of n_heads (516 for 6 heads).
"""
# shapeguard: expect exit 1

import math

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model=512, n_heads=6):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads  # BUG: 512 // 6 = 85, and 6 * 85 = 510
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B = x.size(0)
        # [B, T, d_model] -> [B, H, T, d_k]
        Q = self.W_q(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(B, -1, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, H, T, T]
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(B, -1, self.d_model)
        return self.out(context)


def build_model():
    return MultiHeadAttention(d_model=512, n_heads=6)


def example_inputs(batch=2, seq=7, d_model=512):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
