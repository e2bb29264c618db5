import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

import shapeguard


class PackedAttention(nn.Module):
    def __init__(self, d_model=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    @shapeguard.contract
    def forward(self, x: Float[Tensor, "batch seq d_model"]):
        B, T, C = x.shape
        packed = x.reshape(1, B * T, C)  # the examples back to back, to skip the padding
        q, k, v = self.qkv(packed).view(1, B * T, 3, self.heads, C // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [1, heads, B * T, d_k]
        out = F.scaled_dot_product_attention(q, k, v)  # no block mask
        return out.transpose(1, 2).reshape(B, T, C)


shapeguard.trace(PackedAttention(), torch.randn(2, 3, 32))
