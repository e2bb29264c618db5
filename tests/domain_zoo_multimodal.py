"""Multimodal in the domain zoo: Perceiver (learned latents cross-attend to a masked input
array, then attend to themselves) and a Flamingo-style Perceiver resampler with multi-query
attention (one key/value head; keys are the media tokens and the latents)."""

import torch
from domain_zoo_sizes import Sizes
from einops import rearrange, repeat
from torch import nn


def inputs(s: Sizes) -> tuple:
    """seq_k media (or input array) tokens and their mask (True = real); the latents are seq."""
    return torch.randn(s.batch, s.seq_k, s.d_model), s.padding(s.seq_k)


class PerceiverAttention(nn.Module):
    def __init__(self, d_model, heads, bug=None):
        super().__init__()
        self.heads, self.scale, self.bug = heads, (d_model // heads) ** -0.5, bug
        self.to_q, self.to_kv = nn.Linear(d_model, d_model), nn.Linear(d_model, 2 * d_model)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x, context, mask=None):
        q = self.to_q(x)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in (q, k, v))
        sim = torch.einsum("b h i d, b h j d -> b h i j", q, k)  # <- perceiver_latents_axis
        sim = sim * self.scale
        if mask is not None:
            if self.bug == "perceiver_mask_axis":
                sim = sim.masked_fill(~mask[:, None, :, None], -1e9)  # <- perceiver_mask_axis
            else:
                sim = sim.masked_fill(~mask[:, None, None, :], -1e9)
        cross = mask is not None
        axis = -2 if cross and self.bug == "perceiver_softmax_queries" else -1
        attn = sim.softmax(dim=axis)  # <- perceiver_softmax_queries
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)  # <- perceiver_softmax_queries
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


class Perceiver(nn.Module):
    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.latents = nn.Parameter(torch.randn(s.seq, d) * 0.02)
        self.cross, self.cross_norm = PerceiverAttention(d, s.heads, bug), nn.LayerNorm(d)
        self.latent_attn, self.latent_norm = PerceiverAttention(d, s.heads), nn.LayerNorm(d)

    def forward(self, data, mask):
        B = data.shape[0]
        if self.bug == "perceiver_latents_axis":
            x = repeat(self.latents, "n d -> n b d", b=B)  # <- perceiver_latents_axis
        else:
            x = repeat(self.latents, "n d -> b n d", b=B)
        x = x + self.cross(self.cross_norm(x), data, mask)  # <- perceiver_latents_axis
        n = self.latent_norm(x)
        return x + self.latent_attn(n, n)


class Resampler(nn.Module):
    """Flamingo's PerceiverResampler attention, multi-query: q [B, heads, N, d_k] against
    k, v [B, M + N, d_k] with no heads axis."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.heads, self.d_k, self.bug = s.heads, s.d_k, bug
        self.latents = nn.Parameter(torch.randn(s.seq, d) * 0.02)
        self.norm_media, self.norm_latents = nn.LayerNorm(d), nn.LayerNorm(d)
        self.to_q, self.to_kv = nn.Linear(d, d, bias=False), nn.Linear(d, 2 * s.d_k, bias=False)
        self.to_out = nn.Linear(d, d, bias=False)

    def forward(self, media, mask):
        B, N = media.shape[0], self.latents.shape[0]
        x = self.norm_media(media)
        latents = self.norm_latents(repeat(self.latents, "n d -> b n d", b=B))
        q = rearrange(self.to_q(latents), "b n (h d) -> b h n d", h=self.heads) * self.d_k**-0.5
        k, v = self.to_kv(torch.cat((x, latents), dim=-2)).chunk(2, dim=-1)  # [B, M + N, d_k]
        sim = torch.einsum("b h i d, b j d -> b h i j", q, k)
        keep = torch.cat([mask, torch.ones(B, N, dtype=torch.bool)], dim=1)
        sim = sim.masked_fill(~keep[:, None, None, :], -torch.finfo(sim.dtype).max)
        axis = -2 if self.bug == "resampler_mqa_softmax" else -1
        attn = sim.softmax(dim=axis)  # <- resampler_mqa_softmax
        out = torch.einsum("b h i j, b j d -> b h i d", attn, v)  # <- resampler_mqa_softmax
        if self.bug == "resampler_mqa_merge":
            out = out.reshape(B, N, self.heads * self.d_k)  # <- resampler_mqa_merge
        else:
            out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)
