from torch import nn

from .layers import Attention


class Encoder(nn.Module):
    def __init__(self, d_model=48, n_heads=4):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads)

    def forward(self, x):
        return x + self.attn(self.norm(x))
