import torch
from torch import nn

import shapeguard


class CausalAttention(nn.Module):
    def __init__(self, n_heads=3, d_k=11, max_len=5):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_k
        self.register_buffer("bias", torch.ones(max_len, max_len, dtype=torch.bool).tril())

    def forward(self, q, k):  # q, k: [batch, heads, seq, d_k]
        scores = q @ k.transpose(-2, -1)
        scores = scores.masked_fill(~self.bias, float("-inf"))  # fits seq == max_len only
        return scores.softmax(dim=-1)


shapeguard.trace(CausalAttention(), torch.randn(2, 3, 5, 11), torch.randn(2, 3, 5, 11))
