import math

import torch
from torch import nn

import shapeguard


class Attention(nn.Module):
    def __init__(self, d_model=33, n_heads=3):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, _ = x.shape
        h, d_k = self.n_heads, self.d_k
        # heads folded into the batch for bmm: [B * h, T, d_k], the h heads of an example adjacent
        Q = self.W_q(x).view(B, T, h, d_k).transpose(1, 2).reshape(B * h, T, d_k)
        K = self.W_k(x).view(B, T, h, d_k).transpose(1, 2).reshape(B * h, T, d_k)
        V = self.W_v(x).view(B, T, h, d_k).transpose(1, 2).reshape(B * h, T, d_k)
        attn = torch.softmax(torch.bmm(Q, K.transpose(1, 2)) / math.sqrt(d_k), dim=-1)
        context = torch.bmm(attn, V)
        return context.view(h, B, T, d_k).transpose(0, 1)  # unfolded heads first


shapeguard.trace(Attention(), torch.randn(2, 5, 33))
