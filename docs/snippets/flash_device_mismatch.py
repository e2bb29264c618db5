import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16)  # [batch, seq_q, heads, d_k] on cpu
k = torch.randn(2, 7, 3, 16, device="meta")
v = torch.randn(2, 7, 3, 16, device="meta")
flash_attention(q, k, v, backend="sdpa")
