import torch
from jaxtyping import Float
from torch import Tensor, nn

import shapeguard


@shapeguard.guard
class Attention(nn.Module):
    def __init__(self, d_model=33):
        super().__init__()
        self.d_model = d_model

    def forward(self, x: Float[Tensor, "batch seq d_model"]) -> Float[Tensor, "batch seq d_model"]:
        return x


Attention()(torch.randn(2, 5, 32))
