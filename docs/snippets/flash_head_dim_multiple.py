import flash_attn  # noqa: F401  (registers torch.ops.flash_attn)
import torch

import shapeguard

q = torch.randn(2, 5, 3, 12, dtype=torch.float16, device="cuda")  # d_k=12: not a multiple of 8
k = torch.randn(2, 7, 3, 12, dtype=torch.float16, device="cuda")
v = torch.randn(2, 7, 3, 12, dtype=torch.float16, device="cuda")
with shapeguard.trace():
    out = torch.ops.flash_attn._flash_attn_forward(q, k, v, 0.0, 12**-0.5, False, -1, -1, 0.0, None, False)
