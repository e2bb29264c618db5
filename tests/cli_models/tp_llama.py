"""Llama's attention for tensor-parallel CLI runs: `shapeguard trace tp_llama.py --tp 3`
(simulated ranks) or `torchrun --nproc_per_node=3 -m shapeguard trace tp_llama.py` (real
ones). `parallelize` is the plan both use; the head counts come from --arg.

Sizes: batch 3, seq 5, dim 192, 12 heads of 16, 4 kv heads (at tp=2: 6 and 2 local).
"""

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim=192, n_heads=12, n_kv_heads=4):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


def parallelize(model, mesh):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel()}
    return parallelize_module(model, mesh, {**plan, "wo": RowwiseParallel()})


def example_inputs():
    torch.manual_seed(0)
    return (torch.randn(3, 5, 192),)
