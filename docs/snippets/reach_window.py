import torch
from torch import nn

import shapeguard


class SlidingWindowAttention(nn.Module):
    is_causal = True
    sliding_window = 3  # each query sees its own position and the 2 before it

    def __init__(self, vocab=50, d_model=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)

    def forward(self, input_ids):
        x = self.embed(input_ids)  # [batch, seq, d_model]
        scores = x @ x.transpose(-2, -1)  # [batch, seq_q, seq_k]
        q = torch.arange(x.shape[1])[:, None]
        k = torch.arange(x.shape[1])[None, :]
        keep = (k <= q) & (k >= q - self.sliding_window)  # one key too many
        scores = scores + torch.where(keep, 0.0, torch.finfo(scores.dtype).min)
        return scores.softmax(dim=-1) @ x


shapeguard.trace(SlidingWindowAttention(), torch.randint(1, 50, (2, 8)))
