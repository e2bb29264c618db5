"""Bug: F.scaled_dot_product_attention given [batch, seq, heads, d_k] (flash-attn's layout).

SDPA wants [batch, heads, seq, d_k]. Without the transpose, it reads the seq
axis as heads and attends over the heads instead of over the tokens: every
shape is legal, the output has the right shape, and nothing raises.

    python examples/bug_sdpa_layout.py

shapeguard says:

    shapeguard.ShapeWarning: scaled_dot_product_attention: q is [batch, seq, heads, d_k]: SDPA reads axis 1 as heads and axis 2 as the sequence, so it attends across the 4 heads of each token instead of across the 7 tokens
      in  SelfAttention at examples/bug_sdpa_layout.py:48
          context = F.scaled_dot_product_attention(q, k, v)  # BUG: wants [B, H, T, d_k]
      q      [batch=2, seq=7, heads=4, d_k=12] float32
      k      [batch=2, seq=7, heads=4, d_k=12] float32
      v      [batch=2, seq=7, heads=4, d_k=12] float32
      hint: SDPA wants [batch, heads, seq, d_k]: pass q.transpose(1, 2) (and the same for k and v), then transpose the output back with .transpose(1, 2)

The fix: `q.transpose(1, 2)` (and k, v) before SDPA, and `.transpose(1, 2)` on its
output before merging the heads.
"""
# shapeguard: expect exit 1

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
        q = self.W_q(x).view(B, T, H, d_k)  # [B, T, H, d_k]: flash-attn's layout
        k = self.W_k(x).view(B, T, H, d_k)
        v = self.W_v(x).view(B, T, H, d_k)
        context = F.scaled_dot_product_attention(q, k, v)  # BUG: wants [B, H, T, d_k]
        return self.out(context.reshape(B, T, self.d_model))


def build_model():
    return SelfAttention(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
