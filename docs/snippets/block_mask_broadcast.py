import warnings

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import shapeguard

warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
document = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 2, 2]])  # per example


def same_document(b, h, q_idx, kv_idx):
    return document[b, q_idx] == document[b, kv_idx]


# B=None: one mask, made for example 0 (blocks of 2 positions: long sequences have many)
block_mask = create_block_mask(same_document, None, None, 7, 7, device="cpu", BLOCK_SIZE=2)
q, k, v = (torch.randn(2, 4, 7, 16) for _ in range(3))  # [batch, heads, seq, d_k]
with shapeguard.trace():
    flex_attention(q, k, v, block_mask=block_mask)
