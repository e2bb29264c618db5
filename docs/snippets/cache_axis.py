import torch
from torch import nn

import shapeguard


class Step(nn.Module):
    """One decode step of 3 heads of d_k=11, with the keys cached by the prefill."""

    def __init__(self):
        super().__init__()
        self.n_heads, self.d_k = 3, 11
        self.W_k = nn.Linear(33, 33)
        self.past_k = torch.randn(2, 3, 4, 11)  # [batch, heads, 4 cached tokens, d_k]

    def forward(self, x):
        k = self.W_k(x).view(2, 1, 3, 11).transpose(1, 2)  # [batch, heads, 1, d_k]
        return torch.cat([self.past_k, k], dim=1)  # on the heads axis, not the sequence


shapeguard.trace(Step(), torch.randn(2, 1, 33))
