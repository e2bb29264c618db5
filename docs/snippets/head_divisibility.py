from torch import nn

import shapeguard


@shapeguard.guard
class MultiHeadAttention(nn.Module):
    def __init__(self, d_model=512, n_heads=8):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.d_k = d_model // n_heads


MultiHeadAttention(d_model=512, n_heads=6)
