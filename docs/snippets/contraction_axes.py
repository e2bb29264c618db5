import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # [B, H, T, d_k]
        K = self.W_k(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K  # K^T was meant; runs only because seq == d_k == 11
        return F.softmax(scores, dim=-1) @ V


shapeguard.trace(Attention(), torch.randn(2, 11, 33))  # seq = 11 = d_k
