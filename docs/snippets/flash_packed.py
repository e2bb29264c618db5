import torch
from flash_attn import flash_attn_qkvpacked_func

import shapeguard

qkv = torch.randn(2, 5, 3, 16, dtype=torch.float16, device="meta")  # [batch, seq, heads, d_k]
with shapeguard.trace():
    out = flash_attn_qkvpacked_func(qkv)  # wants [batch, seq, 3, heads, d_k]
