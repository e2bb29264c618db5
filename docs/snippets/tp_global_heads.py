import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import shapeguard
from shapeguard.distributed import fake_tp


class Attention(nn.Module):
    def __init__(self, dim=192, n_heads=12):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        xq = self.wq(x)  # this rank's shard: [5, 8, 96] at tp=2
        xq = xq.view(bs, seqlen, self.n_heads, self.head_dim)
        return self.wo(xq.flatten(2))


with fake_tp(2) as mesh:
    model = parallelize_module(
        Attention(), mesh, {"wq": ColwiseParallel(), "wo": RowwiseParallel()}
    )
    with shapeguard.trace():
        model(torch.randn(5, 8, 192))
