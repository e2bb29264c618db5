import torch

import shapeguard

x = torch.randn(2, 5, 33)  # [batch, seq=5, d_model]
position = torch.randn(7, 33)  # one row per position, for 7 positions
with shapeguard.trace():
    h = x + position
