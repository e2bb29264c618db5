import torch
from torch import nn

import shapeguard


class FinalLayer(nn.Module):
    """DiT's last block: patch tokens modulated by a class label's shift and scale (adaLN)."""

    def __init__(self, channels=3, d_model=8, patch=2):
        super().__init__()
        self.embed = nn.Conv1d(channels, d_model, patch, stride=patch)
        self.label = nn.Embedding(10, d_model)
        self.ada = nn.Linear(d_model, 3 * d_model)

    def forward(self, signal, labels):
        x = self.embed(signal).transpose(1, 2)  # [B, N, D]
        shift, scale, gate = self.ada(self.label(labels)).chunk(3, dim=-1)  # [B, D] each
        x = x * gate.unsqueeze(1)
        return x * (1 + scale.unsqueeze(0)) + shift.unsqueeze(0)  # unsqueeze(1) meant


shapeguard.trace(FinalLayer(), torch.randn(4, 3, 8), torch.randint(0, 10, (4,)))
