import torch
from torch import nn

import shapeguard


class Decoder(nn.Module):
    is_causal = True

    def __init__(self, vocab=50, d_model=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)

    def forward(self, input_ids, attention_mask):  # attention_mask: 1 = real token
        x = self.embed(input_ids)  # [batch, seq, d_model]
        scores = x @ x.transpose(-2, -1)  # [batch, seq_q, seq_k]
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))  # the padding is never hidden
        return scores.softmax(dim=-1) @ x


ids = torch.randint(1, 50, (2, 5))
attention_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # left padding
shapeguard.trace(Decoder(), ids, attention_mask)
