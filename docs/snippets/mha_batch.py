import torch
from torch import nn

import shapeguard

mha = nn.MultiheadAttention(33, 3, batch_first=True)
x = torch.randn(2, 5, 33)  # [batch=2, seq_q, embed_dim]
memory = torch.randn(4, 7, 33)  # [batch=4, seq_k, embed_dim]
with shapeguard.trace():
    out, _ = mha(x, memory, memory)
