import torch
import torch.nn.functional as F
from torch import nn

import shapeguard


class JointAttention(nn.Module):
    """SD3-style joint attention: text tokens and image patches, 3 heads of d_k=4."""

    def __init__(self):
        super().__init__()
        self.heads, self.d_k = 3, 4
        self.patches = nn.Conv2d(3, 12, kernel_size=2, stride=2)  # 2 x 2 patches
        self.txt_q, self.img_q = nn.Linear(12, 12), nn.Linear(12, 12)

    def forward(self, img, txt):
        x = self.patches(img).flatten(2).transpose(1, 2)  # [batch, 4 patches, 12]
        B = x.shape[0]
        qi = self.img_q(x).view(B, -1, self.heads, self.d_k)  # [batch, tokens, heads, d_k]
        qt = self.txt_q(txt).view(B, -1, self.heads, self.d_k)
        q = torch.cat((qt, qi), dim=2)  # on the heads, not the tokens
        return F.scaled_dot_product_attention(*(q.transpose(1, 2),) * 3)


shapeguard.trace(JointAttention(), torch.randn(2, 3, 4, 4), torch.randn(2, 4, 12))
