import torch
from xformers.ops import memory_efficient_attention

import shapeguard

q, k, v = (torch.randn(2, 7, 4, 16) for _ in range(3))  # [batch, seq, heads, d_k]
bias = torch.zeros(2, 1, 1, 7)  # a padding bias shaped for SDPA's broadcasting
bias[1, ..., 5:] = float("-inf")
with shapeguard.trace():
    memory_efficient_attention(q, k, v, attn_bias=bias)
