import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 6, 5, 11)  # [batch, heads=6, seq_q, d_k]
k = torch.randn(2, 4, 7, 11)  # [batch, kv_heads=4, seq_k, d_k]: 6 is not a multiple of 4
v = torch.randn(2, 4, 7, 11)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
