import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16, dtype=torch.bfloat16)  # [batch, seq_q, heads, d_k]
k = torch.randn(2, 7, 3, 16)  # float32
v = torch.randn(2, 7, 3, 16)
flash_attention(q, k, v, backend="sdpa")
