import torch
from xformers.ops import memory_efficient_attention

import shapeguard

q = torch.randn(2, 7, 8, 16)  # [batch, seq, heads=8, d_k]
k = torch.randn(2, 7, 2, 16)  # grouped-query attention: 2 kv heads, not expanded
v = torch.randn(2, 7, 2, 16)
with shapeguard.trace():
    memory_efficient_attention(q, k, v)
