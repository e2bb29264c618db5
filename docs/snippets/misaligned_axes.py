import torch
from torch import nn

import shapeguard


class Latents(nn.Module):
    """Perceiver's cross-attention: learned latents, copied per example, attend to the data."""

    def __init__(self, n_latents=4, d_model=8):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(n_latents, d_model))
        self.to_kv = nn.Linear(d_model, 2 * d_model)

    def forward(self, data):
        B = data.shape[0]
        x = self.latents.unsqueeze(1).expand(-1, B, -1)  # [n, B, d]; [B, n, d] meant
        k, v = self.to_kv(data).chunk(2, dim=-1)
        sim = torch.einsum("b i d, b j d -> b i j", x, k)
        return torch.einsum("b i j, b j d -> b i d", sim.softmax(dim=-1), v)


shapeguard.trace(Latents(), torch.randn(4, 6, 8))
