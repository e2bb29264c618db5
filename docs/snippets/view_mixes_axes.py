import torch
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        return self.W_q(x).view(B, self.n_heads, T, self.d_k)  # heads from the seq axis


shapeguard.trace(Attention(), torch.randn(2, 5, 33))
