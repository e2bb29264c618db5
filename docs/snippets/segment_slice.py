import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class JointAttention(nn.Module):
    """SD3/Flux joint attention: text tokens, then image tokens, one attention over both."""

    def __init__(self, d_model=8, n_heads=2):
        super().__init__()
        self.n_heads = n_heads
        self.img_qkv = nn.Linear(d_model, 3 * d_model)
        self.txt_qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, img, txt):  # [B, N, d], [B, S, d]
        B, N, S = img.shape[0], img.shape[1], txt.shape[1]
        qi, ki, vi = self.img_qkv(img).view(B, N, 3, self.n_heads, -1).unbind(2)
        qt, kt, vt = self.txt_qkv(txt).view(B, S, 3, self.n_heads, -1).unbind(2)
        q, k, v = (torch.cat(p, dim=1).transpose(1, 2) for p in ((qt, qi), (kt, ki), (vt, vi)))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S + N, -1)
        img_out, txt_out = out[:, :N], out[:, N:]  # the text comes first
        return img_out, txt_out


shapeguard.trace(JointAttention(), torch.randn(2, 6, 8), torch.randn(2, 4, 8))
