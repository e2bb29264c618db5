import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.W_q(x).view(B, T, self.n_heads, self.d_k)  # [B, T, H, d_k]
        k = self.W_k(x).view(B, T, self.n_heads, self.d_k)
        v = self.W_v(x).view(B, T, self.n_heads, self.d_k)
        return F.scaled_dot_product_attention(q, k, v)  # wants [B, H, T, d_k]


shapeguard.trace(Attention(), torch.randn(2, 5, 33))
