import torch

import shapeguard

q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq_q, d_k]
k = torch.randn(2, 7, 11)  # [batch, seq_k, d_k]: the heads are missing
with shapeguard.trace():
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k)
