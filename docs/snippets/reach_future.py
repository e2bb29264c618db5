import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class Decoder(nn.Module):
    is_causal = True

    def __init__(self, vocab=50, d_model=32, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        self.embed = nn.Embedding(vocab, d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        B, S, _ = x.shape
        q, k, v = (t.view(B, S, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        keep = torch.ones(S, S, dtype=torch.bool).tril(1)  # one diagonal too many
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


shapeguard.trace(Decoder(), torch.randint(1, 50, (2, 7)))
