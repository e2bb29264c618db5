import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16)  # [batch, seq_q, heads, d_k=16]
k = torch.randn(2, 7, 3, 16)
v = torch.randn(2, 7, 3, 24)  # a value head size of 24: flash-attn 2 takes one head size
flash_attention(q, k, v, backend="sdpa")
