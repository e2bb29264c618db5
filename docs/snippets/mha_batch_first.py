import torch
from torch import nn

import shapeguard


class Encoder(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.pos = nn.Embedding(64, d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads)  # reads [seq, batch, embed_dim]

    def forward(self, x):  # x: [batch, seq, d_model]
        x = x + self.pos(torch.arange(x.shape[1]))  # positions along seq
        out, _ = self.attn(x, x, x)
        return out


shapeguard.trace(Encoder(), torch.randn(2, 5, 33))
