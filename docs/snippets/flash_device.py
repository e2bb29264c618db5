import torch
from flash_attn import flash_attn_func

import shapeguard

q = torch.randn(2, 5, 3, 16, dtype=torch.float16)  # on cpu: FlashAttention runs on CUDA only
k = torch.randn(2, 7, 3, 16, dtype=torch.float16)
v = torch.randn(2, 7, 3, 16, dtype=torch.float16)
with shapeguard.trace():
    out = flash_attn_func(q, k, v)
