import torch

import shapeguard

Q = torch.randn(2, 3, 5, 11)  # [batch, heads, seq, d_k]: bmm wants 3-D
K = torch.randn(2, 3, 5, 11)
with shapeguard.trace():
    scores = torch.bmm(Q, K.transpose(-2, -1))
