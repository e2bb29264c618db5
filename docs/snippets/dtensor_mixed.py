import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import shapeguard
from shapeguard.distributed import fake_tp


class Attention(nn.Module):
    def __init__(self, dim=192, n_heads=12):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, self.n_heads, self.head_dim)  # a DTensor
        rope = torch.ones(seqlen, 1, self.head_dim)  # a plain tensor
        return xq * rope


with fake_tp(2) as mesh:
    model = parallelize_module(Attention(), mesh, {"wq": ColwiseParallel(use_local_output=False)})
    with shapeguard.trace():
        model(torch.randn(5, 8, 192))
