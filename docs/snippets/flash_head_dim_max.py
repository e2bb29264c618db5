import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 320)  # [batch, seq_q, heads, d_k=320]: flash-attn stops at 256
k = torch.randn(2, 7, 3, 320)
v = torch.randn(2, 7, 3, 320)
flash_attention(q, k, v, backend="sdpa")
