import torch

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q, d_k]
k = torch.randn(2, 3, 7, 13)  # [batch, heads, seq_k, 13]
with shapeguard.trace():
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
