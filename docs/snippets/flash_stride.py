import torch
from flash_attn import flash_attn_func

import shapeguard

q = torch.randn(2, 5, 16, 3, dtype=torch.float16, device="meta").transpose(-1, -2)
k = torch.randn(2, 7, 3, 16, dtype=torch.float16, device="meta")
v = torch.randn(2, 7, 3, 16, dtype=torch.float16, device="meta")
with shapeguard.trace():
    out = flash_attn_func(q, k, v)  # q's last axis is not contiguous
