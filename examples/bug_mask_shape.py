"""Bug: a [batch, seq] padding mask applied to [batch, heads, seq, seq] scores as is.

Broadcasting aligns shapes from the right, so the mask's batch axis lands on
the query axis. torch says `The size of tensor a (7) must match the size of
tensor b (2) at non-singleton dimension 2`; when batch happens to equal seq it
says nothing at all and masks the wrong entries. The mask must be
[batch, 1, 1, seq_k] (or [batch, 1, seq_q, seq_k]), as the tutorial's guide
asks.

    python examples/bug_mask_shape.py

shapeguard says:

    shapeguard.ShapeError: scores.masked_fill(~keep, ...): scores.seq_q (7) and (~keep).batch (2) do not broadcast
      in  SelfAttention at examples/bug_mask_shape.py:52
          scores = scores.masked_fill(~keep, float("-inf"))  # BUG: keep is [B, T]
      scores  [batch=2, heads=4, seq_q=7, seq_k=7] float32
      ~keep   [batch=2, seq=7] bool
      hint: (~keep) is a [batch, seq_k] padding mask: use (~keep)[:, None, None, :] (or .unsqueeze(1).unsqueeze(2)) to get [batch, 1, 1, seq_k] = [2, 1, 1, 7]

The fix: `scores.masked_fill(~keep[:, None, None, :], float("-inf"))`.
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

    def forward(self, x, keep):
        B, T, _ = x.shape  # keep: [B, T], True for real tokens
        H, d_k = self.n_heads, self.d_k
        Q = self.W_q(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        K = self.W_k(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        V = self.W_v(x).view(B, T, H, d_k).transpose(1, 2)  # [B, H, T, d_k]
        scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, H, T, T]
        scores = scores.masked_fill(~keep, float("-inf"))  # BUG: keep is [B, T]
        attn = F.softmax(scores, dim=-1)
        context = (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)
        return self.out(context)


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    lengths = torch.tensor([seq, seq - 2])
    keep = torch.arange(seq)[None, :] < lengths[:, None]  # [batch, seq]
    return (torch.randn(batch, seq, d_model), keep), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
