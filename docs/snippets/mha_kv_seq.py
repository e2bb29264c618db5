import torch
from torch import nn

import shapeguard

mha = nn.MultiheadAttention(33, 3, batch_first=True)
x = torch.randn(2, 5, 33)  # [batch, seq_q, embed_dim]
key = torch.randn(2, 7, 33)  # [batch, seq_k=7, embed_dim]
value = torch.randn(2, 6, 33)  # one value short
with shapeguard.trace():
    out, _ = mha(x, key, value)
