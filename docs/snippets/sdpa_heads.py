import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 6, 5, 11)  # [batch, heads=6, seq_q, d_k]
k = torch.randn(2, 2, 7, 11)  # [batch, kv_heads=2, seq_k, d_k]
v = torch.randn(2, 2, 7, 11)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v)  # GQA without enable_gqa=True
