"""A classifier whose forward takes one batch: a dict of token ids and a padding mask."""

import math

import torch.nn.functional as F
from torch import Tensor, nn


class PaddedClassifier(nn.Module):
    def __init__(self, vocab_size=97, d_model=48, n_heads=4, n_classes=3):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.embed = nn.Embedding(vocab_size, d_model)
        self.W_qkv = nn.Linear(d_model, 3 * d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, batch: dict[str, Tensor]):
        tokens, mask = batch["tokens"], batch["mask"]  # [B, T] ids; [B, T] True = real token
        x = self.embed(tokens)
        B, T, C = x.shape
        q, k, v = self.W_qkv(x).view(B, T, 3, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        context = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
        pooled = context.mean(dim=1)
        return self.head(pooled)
