import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class Decoder(nn.Module):
    is_causal = True

    def __init__(self, d_model=32, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.past_key = self.past_value = torch.zeros(2, n_heads, 0, d_model // n_heads)

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = (t.view(B, S, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        k = self.past_key = torch.cat([self.past_key, k], dim=2)
        v = self.past_value = torch.cat([self.past_value, v], dim=2)
        positions = torch.arange(S)  # restarts at 0: the cache's length + arange(S) is right
        keep = torch.arange(k.size(2))[None, :] <= positions[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


decoder = Decoder()
decoder(torch.randn(2, 6, 32))  # the prompt fills the cache
shapeguard.trace(decoder, torch.randn(2, 1, 32))  # one decoding step
