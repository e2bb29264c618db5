import torch
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads

    def forward(self, q, k, mask):  # q, k: [batch, heads, seq, d_k]
        scores = q @ k.transpose(-2, -1)  # [batch, heads, seq_q, seq_k]
        scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(dim=-1)


q, k = torch.randn(2, 3, 5, 11), torch.randn(2, 3, 5, 11)
mask = torch.ones(5, 5, dtype=torch.bool).tril()  # True = keep, but masked_fill hides True
shapeguard.trace(Attention(), q, k, mask)
