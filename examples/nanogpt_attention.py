"""nanoGPT's causal self-attention, with shape contracts, guarded.

The layer is Karpathy's `CausalSelfAttention` (one `c_attn` projection split
into q, k, v; a causal mask buffer `bias` sliced to the sequence length), written
with the manual attention path. Its forward carries a contract: `n_embd` in the
annotation binds to `self.n_embd`, so an input of the wrong width fails at the
call with the module's own number, and the trace names the axes `batch`,
`seq` and `n_embd` as the contract does. Run it to see every tensor:

    python examples/nanogpt_attention.py
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

import shapeguard


@dataclass
class GPTConfig:
    block_size: int = 64
    n_embd: int = 48
    n_head: int = 6
    dropout: float = 0.0
    bias: bool = True


@shapeguard.guard
class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}")
        # key, query, value projections for all heads, in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # causal mask: only attend to the left in the input sequence
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(config.block_size, config.block_size)).view(
                1, 1, config.block_size, config.block_size
            ),
        )

    def forward(self, x: Float[Tensor, "batch seq n_embd"]) -> Float[Tensor, "batch seq n_embd"]:
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (n_embd)

        # query, key, values for all heads, with the head axis moved forward: (B, nh, T, hs)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

        # causal self-attention: (B, nh, T, hs) x (B, nh, hs, T) -> (B, nh, T, T)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble all head outputs

        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y


def build_model():
    return CausalSelfAttention(GPTConfig())


def example_inputs(batch: int = 2, seq: int = 16, n_embd: int = 48):
    """A batch of token embeddings, shorter than block_size as in generation."""
    return (torch.randn(batch, seq, n_embd),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    model = build_model()
    args, kwargs = example_inputs()
    trace = shapeguard.trace(model, *args, **kwargs)
    print(trace.table())
