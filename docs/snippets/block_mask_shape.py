import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import shapeguard

warnings.filterwarnings("ignore", "flex_attention called without torch.compile")


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


block_mask = create_block_mask(causal, None, None, 9, 9, device="cpu")  # made for 9 positions
q, k, v = (torch.randn(2, 4, 7, 16) for _ in range(3))  # [batch, heads, seq=7, d_k]
with shapeguard.trace():
    flex_attention(q, k, v, block_mask=block_mask)
