import torch
from torch import nn

import shapeguard

mha = nn.MultiheadAttention(33, 3, batch_first=True)
x = torch.randn(2, 5, 33)  # [batch, seq, embed_dim]
mask = torch.zeros(2, 5, 5, dtype=torch.bool)  # [batch, seq_q, seq_k]: one per head is needed
with shapeguard.trace():
    out, _ = mha(x, x, x, attn_mask=mask)
