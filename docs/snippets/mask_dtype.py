import torch

import shapeguard

scores = torch.randn(2, 3, 5, 5)  # [batch, heads, seq_q, seq_k]
mask = torch.ones(2, 1, 5, 5)  # float 1/0, not bool
with shapeguard.trace():
    scores = scores.masked_fill(mask, float("-inf"))
