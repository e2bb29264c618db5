import torch
from torch import nn

import shapeguard

W_q = nn.Linear(32, 32)
x = torch.randn(2, 5, 33)  # [batch, seq, 33 features]
with shapeguard.trace():
    Q = W_q(x)
