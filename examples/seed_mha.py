"""The self-attention tutorial's MultiHeadAttention, fixed and guarded.

The tutorial's listing never stores `self.n_heads` (its forward then fails with
an AttributeError); this version stores it, and `@shapeguard.guard` checks every
forward. Run it to see the shape of every Q/K/V/scores/mask/context tensor:

    python examples/seed_mha.py
"""

import math

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor, nn

import shapeguard


@shapeguard.guard
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model=512, n_heads=8):
        super().__init__()
        if d_model % n_heads:  # a real check: `assert` vanishes under python -O
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model = d_model
        self.n_heads = n_heads  # the tutorial forgot this line
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],
        mask: Bool[Tensor, "batch 1 seq seq"] | None = None,
    ) -> Float[Tensor, "batch seq d_model"]:
        batch_size = x.size(0)
        # [batch, seq, d_model] -> [batch, heads, seq, d_k]
        Q = self.W_q(x).view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(batch_size, -1, self.n_heads, self.d_k).transpose(1, 2)
        # [batch, heads, seq, seq]
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        attn = F.softmax(scores, dim=-1)
        context = torch.matmul(attn, V).transpose(1, 2).contiguous()
        context = context.view(batch_size, -1, self.d_model)
        return self.out(context)


def example_inputs(batch: int = 2, seq: int = 16, d_model: int = 512):
    """A batch and a [batch, 1, seq, seq] causal mask, as the tutorial's guide asks."""
    x = torch.randn(batch, seq, d_model)
    mask = torch.tril(torch.ones(seq, seq, dtype=torch.bool)).expand(batch, 1, seq, seq)
    return (x,), {"mask": mask}


def build_model():
    return MultiHeadAttention(d_model=512, n_heads=8)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = build_model()
    args, kwargs = example_inputs()
    trace = shapeguard.trace(model, *args, **kwargs)
    print(trace.table())
