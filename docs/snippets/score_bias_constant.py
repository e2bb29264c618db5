import math

import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class AlibiAttention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        slopes = torch.tensor([2 ** (-8 * (i + 1) / n_heads) for i in range(n_heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # [B, H, T, d_k]
        K = self.W_k(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, H, T, T]
        pos = torch.arange(T)
        alibi = -self.slopes[:, None, None] * pos[:, None]  # [H, T, 1]: per query, not per key
        scores = scores + alibi
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        attn = F.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return attn @ V


shapeguard.trace(AlibiAttention(), torch.randn(2, 5, 33))
