import torch
from flash_attn import flash_attn_func

import shapeguard

q = torch.randn(2, 5, 3, 16, device="meta")  # float32: FlashAttention takes fp16/bf16
k = torch.randn(2, 7, 3, 16, device="meta")
v = torch.randn(2, 7, 3, 16, device="meta")
with shapeguard.trace():
    out = flash_attn_func(q, k, v)
