import torch
from torch import nn
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import shapeguard
from shapeguard.distributed import fake_tp


class Block(nn.Module):
    def __init__(self, dim=192):
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        h = self.down(self.up(x))  # plain TP: down's all_reduce makes h whole on every rank
        return self.norm(h)  # SequenceParallel takes h for this rank's slice of seq


plan = {"up": ColwiseParallel(), "down": RowwiseParallel(), "norm": SequenceParallel()}
with fake_tp(2) as mesh:
    model = parallelize_module(Block(), mesh, plan)
    with shapeguard.trace():
        model(torch.randn(3, 10, 192))
