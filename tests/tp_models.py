"""Tensor-parallel attention for the TP tests: Llama's layout (wq, wk, wv column-parallel,
wo row-parallel), with the head counts the bug under test needs.

Sizes are pairwise distinct on the local shard too (tp=2): batch 3, seq 5, head_dim 16,
local heads 6 (12 global), local kv heads 2 (4 global), local q features 96.
"""

import torch
import torch.nn.functional as F
from torch import nn

B, S, DIM, H, KV = 3, 5, 192, 12, 4
HD = DIM // H  # 16


class Attention(nn.Module):
    """Llama's attention. `local`: which head counts the forward views with: "tp" divides
    the declared counts by tp (the TP tutorial's local activations), "none" uses them as
    they are (right for DTensor activations, the bug on local shards), "infer" views with
    -1 as torchtitan does. `spelling` "t5" views as `view(bs, -1, n_heads, d)`.
    `seq_first`: x is [seq, batch, dim] (Megatron's layout), and so is the output.
    `manual`: softmax(q k^T) v by hand, as DTensor activations need (DTensor has no
    sharding strategy for SDPA's CPU kernel, and no GQA: give n_kv_heads=n_heads)."""

    def __init__(
        self,
        dim=DIM,
        n_heads=H,
        n_kv_heads=KV,
        *,
        tp=1,
        local="infer",
        spelling="llama",
        manual=False,
        seq_first=False,
    ):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.tp, self.local, self.spelling, self.manual = tp, local, spelling, manual
        self.seq_first = seq_first
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def _heads(self, count: int) -> int:
        if self.local == "infer":
            return -1
        return count // self.tp if self.local == "tp" else count

    def forward(self, x):
        if self.seq_first:
            x = x.transpose(0, 1)
        bs, seqlen, _ = x.shape
        h, kv, hd = self._heads(self.n_heads), self._heads(self.n_kv_heads), self.head_dim
        if self.spelling == "t5":
            xq = self.wq(x).view(bs, -1, h, hd).transpose(1, 2)
        else:
            xq = self.wq(x).view(bs, seqlen, h, hd).transpose(1, 2)
        xk = self.wk(x).view(bs, seqlen, kv, hd).transpose(1, 2)
        xv = self.wv(x).view(bs, seqlen, kv, hd).transpose(1, 2)
        if self.manual:
            scores = (xq @ xk.transpose(-2, -1)) / hd**0.5
            out = scores.softmax(dim=-1) @ xv
        else:
            out = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(bs, seqlen, -1)
        return self.wo(out.transpose(0, 1) if self.seq_first else out)


def plan(*, local_output: bool = True) -> dict:
    """torchtitan's attention plan: q/k/v colwise, o rowwise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col = {"use_local_output": local_output}
    return {
        "wq": ColwiseParallel(**col),
        "wk": ColwiseParallel(**col),
        "wv": ColwiseParallel(**col),
        "wo": RowwiseParallel(),
    }


# Llama-3-8B's attention: 32 heads of 128, 8 kv heads (torchtitan#932 at tp=16).
LLAMA3_8B = {"dim": 4096, "n_heads": 32, "n_kv_heads": 8}


def parallel(mesh, model, **plan_kwargs):
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(model, mesh, plan(**plan_kwargs))


def example_input(device=None, seq=S, batch=B):
    return torch.randn(batch, seq, DIM, device=device)
