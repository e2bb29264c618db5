import torch
from torch import nn

import shapeguard


class RandomMasking(nn.Module):
    def __init__(self, patch_dim=12, d_model=32):
        super().__init__()
        self.embed = nn.Linear(patch_dim, d_model)

    def forward(self, patches, keep=3):
        x = self.embed(patches)  # [N, L, D]
        N, L, D = x.shape
        ids_keep = torch.argsort(torch.rand(N, L), dim=1)[:, :keep]  # token ids
        index = ids_keep.unsqueeze(-1).repeat(1, 1, D)  # [N, keep, D]
        return torch.gather(x, dim=2, index=index)  # dim=1 meant: runs while D >= L


shapeguard.trace(RandomMasking(), torch.randn(2, 6, 12))
