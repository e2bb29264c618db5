"""Time series in the domain zoo: an Informer-style encoder layer (circular conv token
embedding, einsum full attention in [B, L, heads, d_k]) and Autoformer's series decomposition
(a moving average over time) in front of the same attention."""

import torch
from domain_zoo_sizes import Sizes
from torch import nn


def series_inputs(s: Sizes) -> tuple:
    """[batch, steps, variables] (Informer's x_enc), steps = seq."""
    return (torch.randn(s.batch, s.seq, s.in_channels),)


class FullAttention(nn.Module):
    """Informer/Autoformer's AttentionLayer + FullAttention."""

    def __init__(self, d_model, heads, bug=None):
        super().__init__()
        self.heads, self.bug = heads, bug
        self.query, self.key = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.value, self.out = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, L, _ = x.shape
        q = self.query(x).view(B, L, self.heads, -1)
        k = self.key(x).view(B, L, self.heads, -1)
        v = self.value(x).view(B, L, self.heads, -1)
        scale = q.shape[-1] ** -0.5
        if self.bug == "informer_scores_einsum":
            scores = torch.einsum("blhe,bshe->bhsl", q, k)  # <- informer_scores_einsum
        else:
            scores = torch.einsum("blhe,bshe->bhls", q, k)
        A = torch.softmax(scale * scores, dim=-1)  # <- informer_scores_einsum
        if self.bug == "informer_aggregate_transposed":
            V = torch.einsum("bhls,blhd->bshd", A, v)  # <- informer_aggregate_transposed
        else:
            V = torch.einsum("bhls,bshd->blhd", A, v)
        return self.out(V.reshape(B, L, -1))


class TokenEmbedding(nn.Module):
    def __init__(self, c_in, d_model, bug=None):
        super().__init__()
        self.bug = bug
        self.conv = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode="circular")

    def forward(self, x):
        y = self.conv(x.permute(0, 2, 1))  # [B, d, L]
        if self.bug == "informer_embed_reshape":
            return y.reshape(x.shape[0], x.shape[1], -1)  # <- informer_embed_reshape
        return y.transpose(1, 2)


class Informer(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.embed = TokenEmbedding(s.in_channels, d, bug)
        self.register_buffer("positions", torch.randn(s.seq, d) * 0.02)
        self.attn, self.norm = FullAttention(d, s.heads, bug), nn.LayerNorm(d)

    def forward(self, x_enc):
        x = self.embed(x_enc) + self.positions
        return self.norm(x + self.attn(x))


class Autoformer(nn.Module):
    """Autoformer's series_decomp (moving average, replicated ends) on the embedded series;
    the seasonal part goes through attention, the trend is added back."""

    def __init__(self, s: Sizes, bug=None, kernel=3):
        super().__init__()
        d = s.d_model
        self.bug, self.kernel = bug, kernel
        self.embed = TokenEmbedding(s.in_channels, d)
        self.avg = nn.AvgPool1d(kernel_size=kernel, stride=1)
        self.attn, self.norm = FullAttention(d, s.heads), nn.LayerNorm(d)

    def moving_avg(self, x):
        B, L, C = x.shape
        front = x[:, 0:1, :].repeat(1, (self.kernel - 1) // 2, 1)
        end = x[:, -1:, :].repeat(1, (self.kernel - 1) // 2, 1)
        x = torch.cat([front, x, end], dim=1)
        if self.bug == "autoformer_decomp_reshape":
            x = self.avg(x.reshape(B, C, -1))  # <- autoformer_decomp_reshape
            return x.reshape(B, L, C)  # <- autoformer_decomp_reshape
        return self.avg(x.permute(0, 2, 1)).permute(0, 2, 1)

    def forward(self, x_enc):
        x = self.embed(x_enc)
        trend = self.moving_avg(x)
        seasonal = x - trend
        return self.norm(seasonal + self.attn(seasonal)) + trend
