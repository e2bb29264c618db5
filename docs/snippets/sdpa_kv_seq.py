import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q, d_k]
k = torch.randn(2, 3, 7, 11)  # [batch, heads, seq_k=7, d_k]
v = torch.randn(2, 3, 6, 11)  # one value short
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v)
