import torch
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads

    def forward(self, q, k, mask):  # q, k: [batch, heads, seq, d_k]
        scores = q @ k.transpose(-2, -1)  # [batch, heads, seq_q, seq_k]
        scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1)


q, k = torch.randn(5, 3, 5, 11), torch.randn(5, 3, 5, 11)  # batch == seq == 5
lengths = torch.tensor([5, 4, 3, 2, 1])
mask = torch.arange(5)[None, :] < lengths[:, None]  # [batch, seq] padding, True = keep
shapeguard.trace(Attention(), q, k, mask)
