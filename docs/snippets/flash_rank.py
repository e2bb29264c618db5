import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 11)  # [batch, seq, d_k]: the heads axis is missing
k = torch.randn(2, 7, 3, 11)
v = torch.randn(2, 7, 3, 11)
flash_attention(q, k, v, backend="sdpa")
