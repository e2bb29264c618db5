import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 6, 16)  # [batch, seq_q, heads=6, d_k]
k = torch.randn(2, 7, 3, 16)  # 3 kv heads
v = torch.randn(2, 7, 2, 16)  # 2 value heads: k and v disagree
flash_attention(q, k, v, backend="sdpa")
