"""A training script that parses its arguments at import, as many research scripts do.

`shapeguard trace argparse_script.py` imports it with an argv of its own
(`[file]`, plus what follows `--`), so the parser sees no shapeguard options.
"""

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="train a small self-attention block")
parser.add_argument("--d_model", type=int, default=64)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--lr", type=float, default=3e-4)
args = parser.parse_args()


class SelfAttention(nn.Module):
    def __init__(self, d_model=args.d_model, heads=args.heads):
        super().__init__()
        self.heads = heads
        self.d_k = d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.heads, self.d_k).transpose(1, 2)  # [B, heads, T, d_k]
        k = k.view(B, T, self.heads, self.d_k).transpose(1, 2)
        v = v.view(B, T, self.heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # [B, heads, T, T]
        attn = F.softmax(scores, dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)


if __name__ == "__main__":
    model = SelfAttention()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for _ in range(3):
        loss = model(torch.randn(8, 16, args.d_model)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
