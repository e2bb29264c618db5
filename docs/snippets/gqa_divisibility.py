from torch import nn

import shapeguard


@shapeguard.guard
class GQAttention(nn.Module):
    def __init__(self, d_model=512, n_heads=8, n_kv_heads=2):
        super().__init__()
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads


GQAttention(n_heads=8, n_kv_heads=3)
