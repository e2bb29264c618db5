import torch

import shapeguard

x = torch.randn(2, 5, 33)  # [batch, seq, 33 features]
with shapeguard.trace():
    heads = x.view(2, 5, 4, 8)  # 4 heads of 8 = 32 features
