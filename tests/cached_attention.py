"""A hand-written causal self-attention with rotary positions and a key-value cache that
follows shapeguard's cache protocol (`forward(x, mask=None, cache=None)`, `cache` a dict
read and written in place), with one optional cache bug.

Sizes are pairwise distinct: batch 2, heads 3, d_k 8 (d_model 24), seq 7.

Bugs (the five of issue 14):
- "rope_restart": the new tokens' rotary positions restart at 0 on every step;
- "is_causal_step": SDPA's is_causal=True on a decode step (the triangle is top-left);
- "cat_heads": the cache is concatenated on the heads axis;
- "square_mask": a square [T, T] causal mask against cached + new keys;
- "stale_mask": the padding mask kept in the cache is never extended by the new tokens.

`style` is "sdpa" (scaled_dot_product_attention with a bool mask) or "matmul"
(scores, masked_fill, softmax).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

B, H, DK, S = 2, 3, 8, 7
D = H * DK


def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary positions on [batch, heads, seq, d_k] (half-split pairs)."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=x.dtype) / half))
    angles = positions.to(x.dtype)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class CachedAttention(nn.Module):
    def __init__(self, bug: str | None = None, style: str = "sdpa"):
        super().__init__()
        self.n_heads, self.d_k, self.d_model = H, DK, D
        self.bug, self.style = bug, style
        self.W_q = nn.Linear(D, D)
        self.W_k = nn.Linear(D, D)
        self.W_v = nn.Linear(D, D)
        self.W_o = nn.Linear(D, D)

    def forward(self, x, mask=None, cache=None):
        batch, new, _ = x.shape
        past = cache.get("k") if cache is not None else None
        start = past.shape[2] if past is not None else 0
        q = self.W_q(x).view(batch, new, H, DK).transpose(1, 2)
        k = self.W_k(x).view(batch, new, H, DK).transpose(1, 2)
        v = self.W_v(x).view(batch, new, H, DK).transpose(1, 2)
        first = 0 if self.bug == "rope_restart" else start
        positions = torch.arange(first, first + new)
        q, k = rotate(q, positions), rotate(k, positions)
        if past is not None:
            axis = 1 if self.bug == "cat_heads" else 2
            k = torch.cat([cache["k"], k], dim=axis)
            v = torch.cat([cache["v"], v], dim=axis)
        if cache is not None:
            cache["k"], cache["v"] = k, v
            if self.bug == "stale_mask" and mask is not None:
                mask = cache.setdefault("mask", mask)
        total = k.shape[2]
        if self.bug == "square_mask":
            keep = torch.ones(new, new, dtype=torch.bool).tril()
        else:
            keep = torch.ones(new, total, dtype=torch.bool).tril(total - new)
        if self.style == "sdpa":
            if mask is not None:
                keep = keep & (mask[:, None, None, :] != 0)
            if self.bug == "is_causal_step":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(DK)
            scores = scores.masked_fill(~keep, float("-inf"))
            if mask is not None:
                scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
            out = F.softmax(scores, dim=-1) @ v
        out = out.transpose(1, 2).reshape(batch, new, D)
        return self.W_o(out)
