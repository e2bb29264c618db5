"""torch's own nn.MultiheadAttention, batch_first, with a key padding mask.

`nn.MultiheadAttention` runs as one composite op, so shapeguard checks its
documented contract (layouts, embed_dim, key_padding_mask [batch, seq_k] with
True = ignore) rather than the ops inside it. Run it to see the shapes:

    python examples/torch_mha.py
"""
# shapeguard: expect exit 0

import torch
from torch import nn

import shapeguard


class EncoderBlock(nn.Module):
    def __init__(self, d_model=48, n_heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x, padding):  # x: [B, T, d_model]; padding: [B, T], True = pad
        context, _ = self.attn(x, x, x, key_padding_mask=padding, need_weights=False)
        return self.norm(x + context)  # [B, T, d_model]


def build_model():
    return EncoderBlock(d_model=48, n_heads=4)


def example_inputs(batch=2, seq=7, d_model=48):
    lengths = torch.tensor([seq, seq - 3])
    padding = torch.arange(seq)[None, :] >= lengths[:, None]  # [batch, seq], True = pad
    return (torch.randn(batch, seq, d_model), padding), {}


if __name__ == "__main__":
    torch.manual_seed(0)
    args, kwargs = example_inputs()
    print(shapeguard.trace(build_model(), *args, **kwargs).table())
