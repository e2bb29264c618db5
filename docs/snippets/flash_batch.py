import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16)  # [batch=2, seq_q, heads, d_k]
k = torch.randn(4, 7, 3, 16)  # a batch of 4: keys from another batch
v = torch.randn(4, 7, 3, 16)
flash_attention(q, k, v, backend="sdpa")
