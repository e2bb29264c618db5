import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import shapeguard
from shapeguard.distributed import fake_tp


class Attention(nn.Module):  # Llama-3-8B's: 32 heads of 128, 8 kv heads
    def __init__(self, dim=4096, n_heads=32, n_kv_heads=8):
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


plan = {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
        "wo": RowwiseParallel()}  # fmt: skip
with fake_tp(16) as mesh:  # rank 0 of 16, in this process, on the meta device
    with torch.device("meta"):
        model = parallelize_module(Attention(), mesh, plan)
    with shapeguard.trace():
        model(torch.empty(1, 64, 4096, device="meta"))
