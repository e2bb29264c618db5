import torch
from torch import nn

import shapeguard

mha = nn.MultiheadAttention(33, 3, batch_first=True)
x = torch.randn(2, 5, 33)  # [batch, seq, embed_dim]
padding = torch.zeros(5, 2, dtype=torch.bool)  # [seq, batch]: transposed
with shapeguard.trace():
    out, _ = mha(x, x, x, key_padding_mask=padding)
