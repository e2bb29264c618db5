import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q, d_k=11]
k = torch.randn(2, 3, 7, 13)  # [batch, heads, seq_k, 13]
v = torch.randn(2, 3, 7, 13)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v)
