"""Bug: [batch, seq, embed] inputs given to an nn.MultiheadAttention built without batch_first.

`nn.MultiheadAttention` reads its inputs as [seq, batch, embed] unless it is
built with `batch_first=True`. Given [batch=2, seq=7, embed=48] it sees a
sequence of 2 tokens in a batch of 7: every "token" attends across the batch,
and the output has the right shape. Nothing raises. (The positions added along T
are what tells shapeguard that axis 1 is the sequence: a seq-first model hands its
[seq, batch, embed] input to the module in exactly the same way.)

    python examples/bug_batch_first.py

shapeguard says:

    shapeguard.ShapeWarning: MultiheadAttention(batch_first=False) got x [batch=2, seq=7, embed_dim=48]: it reads [seq, batch, embed_dim], so it attends across the 2 examples of the batch, once per token
      in  attn (MultiheadAttention) at examples/bug_batch_first.py:40
          context, _ = self.attn(x, x, x, need_weights=False)
      x      [batch=2, seq=7, 48] float32
      hint: build nn.MultiheadAttention(..., batch_first=True), or pass x.transpose(0, 1) (and the same for key and value) and transpose the output back

The fix: `nn.MultiheadAttention(d_model, n_heads, batch_first=True)`, or pass
`x.transpose(0, 1)` and transpose the output back.
"""
# shapeguard: expect exit 1

import torch
from torch import nn

import shapeguard


class Encoder(nn.Module):
    def __init__(self, d_model=48, n_heads=4, max_len=64):
        super().__init__()
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads)  # BUG: batch_first=False
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):  # x: [B, T, d_model]
        x = x + self.pos(torch.arange(x.shape[1]))  # positions along T
        context, _ = self.attn(x, x, x, need_weights=False)
        return self.norm(x + context)


def build_model():
    return Encoder(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    return (torch.randn(batch, seq, d_model),), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
