import torch
from torch import nn

import shapeguard


class RotaryAttention(nn.Module):
    def __init__(self, d_model=48, n_heads=4):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)  # [B, H, T, d_k]
        angles = torch.arange(T)[:, None] * torch.ones(self.d_k)  # [T, d_k]
        cos = angles.cos()[:, None, :]  # [T, 1, d_k]: shaped for [B, T, H, d_k]
        return q * cos  # lines up T with H: legal only because seq == heads == 4


shapeguard.trace(RotaryAttention(), torch.randn(2, 4, 48))
