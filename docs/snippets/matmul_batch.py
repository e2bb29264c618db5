import torch

import shapeguard

Q = torch.randn(2, 3, 5, 11)  # [batch, heads=3, seq, d_k]
K = torch.randn(2, 6, 5, 11)  # [batch, heads=6, seq, d_k]
with shapeguard.trace():
    scores = Q @ K.transpose(-2, -1)
