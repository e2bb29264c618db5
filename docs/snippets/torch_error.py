import torch

import shapeguard

Q = torch.randn(2, 3, 5, 11)
K = torch.randn(2, 3, 7, 11)
with shapeguard.trace():
    both = torch.cat([Q, K], dim=-1)  # no shapeguard rule for cat: torch's message, with context
