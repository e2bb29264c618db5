import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16)  # [batch, seq_q, heads, d_k]
k = torch.randn(2, 7, 3, 16)  # 7 keys
v = torch.randn(2, 6, 3, 16)  # 6 values: one value short
flash_attention(q, k, v, backend="sdpa")
