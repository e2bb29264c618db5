import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 6, 16)  # [batch, seq_q, heads=6, d_k]
k = torch.randn(2, 7, 4, 16)  # 4 kv heads: 6 query heads do not split into 4 groups
v = torch.randn(2, 7, 4, 16)
flash_attention(q, k, v, backend="sdpa")
