import torch
from torch import nn

import shapeguard

mha = nn.MultiheadAttention(33, 3, batch_first=True)
x = torch.randn(2, 5, 32)  # [batch, seq, 32 features]: the module wants 33
with shapeguard.trace():
    out, _ = mha(x, x, x)
