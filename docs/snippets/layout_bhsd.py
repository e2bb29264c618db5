import torch

from shapeguard.attention import flash_attention

q = torch.randn(2, 5, 3, 16)  # [batch, seq_q, heads, d_k]: flash-attn's layout
k = torch.randn(2, 7, 3, 16)
v = torch.randn(2, 7, 3, 16)
flash_attention(q, k, v, layout="bhsd", backend="sdpa")  # says [batch, heads, seq, d_k]
