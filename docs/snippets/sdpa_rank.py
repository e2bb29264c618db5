import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q, d_k]
k = torch.randn(2, 7, 11)  # [batch, seq_k, d_k]: the heads are missing
v = torch.randn(2, 7, 11)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v)
