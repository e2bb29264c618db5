import torch
from torch import nn

import shapeguard


class Decoder(nn.Module):
    is_causal = True

    def __init__(self, vocab=50, d_model=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)

    def forward(self, input_ids, position_ids):
        x = self.embed(input_ids)  # [batch, seq, d_model]
        scores = x @ x.transpose(-2, -1)  # [batch, seq_q, seq_k]
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))  # one causal mask for the packed row
        return scores.softmax(dim=-1) @ x


ids = torch.randint(1, 50, (1, 7))
position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])  # two documents packed in one row
shapeguard.trace(Decoder(), ids, position_ids)
