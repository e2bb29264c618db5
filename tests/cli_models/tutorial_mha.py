"""The tutorial's multi-head attention: W_q/W_k/W_v/W_o, a split_heads helper, and a
padding mask where 1 marks a real token and 0 a padded one (HF's convention)."""

import math

import torch.nn.functional as F
from torch import nn


class MyMHA(nn.Module):
    def __init__(self, d_model=64, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def split_heads(self, t):
        B, S, _ = t.shape
        return t.view(B, S, self.n_heads, self.d_k).transpose(1, 2)  # [B, heads, S, d_k]

    def forward(self, q_in, k_in, v_in, pad_mask):
        B, S, _ = q_in.shape
        Q = self.split_heads(self.W_q(q_in))
        K = self.split_heads(self.W_k(k_in))
        V = self.split_heads(self.W_v(v_in))
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        scores = scores.masked_fill(pad_mask[:, None, None, :] == 0, float("-inf"))
        context = F.softmax(scores, dim=-1) @ V
        return self.W_o(context.transpose(1, 2).reshape(B, S, -1))
