import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch=2, heads, seq_q, d_k]
k = torch.randn(4, 3, 7, 11)  # [batch=4, ...]
v = torch.randn(4, 3, 7, 11)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v)
