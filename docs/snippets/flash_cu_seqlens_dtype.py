import torch

from shapeguard.attention import flash_attention_varlen

q = torch.randn(12, 3, 16)  # [total_q, heads, d_k]: two sequences, 5 + 7 tokens
k = torch.randn(12, 3, 16)
v = torch.randn(12, 3, 16)
cu = torch.tensor([0, 5, 12])  # int64: flash-attn wants int32
flash_attention_varlen(q, k, v, cu, cu, 7, 7, backend="sdpa")
