import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q=5, d_k]: the last 5 of 7 tokens
k = torch.randn(2, 3, 7, 11)  # [batch, heads, seq_k=7, d_k]: a cache of 7 tokens
v = torch.randn(2, 3, 7, 11)
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
