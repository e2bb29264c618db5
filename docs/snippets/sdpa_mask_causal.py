import torch
import torch.nn.functional as F

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq, d_k]
k = torch.randn(2, 3, 5, 11)
v = torch.randn(2, 3, 5, 11)
keep = torch.ones(5, 5, dtype=torch.bool).tril()
with shapeguard.trace():
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=True)
