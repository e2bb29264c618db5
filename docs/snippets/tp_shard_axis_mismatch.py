import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import shapeguard
from shapeguard.distributed import fake_tp


class Attention(nn.Module):
    def __init__(self, dim=192, n_heads=12):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq, self.wk = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.wv, self.wo = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x):
        bs, seqlen, _ = x.shape
        q = self.wq(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bs, seqlen, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class Layer(nn.Module):
    def __init__(self, dim=192):
        super().__init__()
        self.norm, self.attention = nn.LayerNorm(dim), Attention(dim)

    def forward(self, x):
        return x + self.attention(self.norm(x))


def sequence_parallel(layer, dim):  # torchtitan's plan, every shard along `dim`
    return {
        f"{layer}.norm": SequenceParallel(sequence_dim=dim),
        f"{layer}.attention": PrepareModuleInput(
            input_layouts=Shard(dim), desired_input_layouts=Replicate()
        ),
        **{f"{layer}.attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")},
        f"{layer}.attention.wo": RowwiseParallel(output_layouts=Shard(dim)),
    }


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


plan = {**sequence_parallel("layers.0", 1), **sequence_parallel("layers.1", 0)}  # seq, batch
with fake_tp(2) as mesh:
    model = parallelize_module(Model(), mesh, plan)
    with shapeguard.trace():
        model(torch.randn(3, 5, 192))  # this rank's 5 of the 10 tokens
