import math

import torch
from torch import nn

import shapeguard


class QKVAttentionLegacy(nn.Module):
    """guided-diffusion's legacy attention: q, k, v as [batch * heads, channels, tokens]."""

    def __init__(self, channels=12, n_heads=3):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)

    def forward(self, x):  # [B, C, T]
        qkv = self.qkv(x)
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale).softmax(dim=-1)
        a = torch.einsum("bst,bcs->bct", weight, v)  # sums over the queries
        return a.reshape(bs, -1, length)


shapeguard.trace(QKVAttentionLegacy(), torch.randn(2, 12, 5))
