import torch
from torch import nn

import shapeguard


class Encoder(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads)  # reads [seq, batch, embed_dim]

    def forward(self, x):  # x: [batch, seq, d_model]
        out, _ = self.attn(x, x, x)
        return out


shapeguard.trace(Encoder(), torch.randn(2, 5, 33))
