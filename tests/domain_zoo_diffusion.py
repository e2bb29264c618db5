"""Diffusion in the domain zoo: a stable-diffusion spatial transformer, guided-diffusion's legacy
QKV attention block, a DiT block (adaLN-Zero) and SD3/Flux-style joint text-image attention.

As in the originals, the spatial transformer's and the legacy block's output projections start at
zero (`zero_module`) and DiT's modulation is zero-initialised (adaLN-Zero)."""

import math

import torch
import torch.nn.functional as F
from domain_zoo_sizes import Sizes
from einops import rearrange, repeat
from torch import nn


def zero_module(module: nn.Module) -> nn.Module:
    for p in module.parameters():
        nn.init.zeros_(p)
    return module


def latents(s: Sizes) -> tuple:
    """A latent feature map, a text context and its padding mask (True = real token)."""
    return (
        torch.randn(s.batch, s.d_model, *s.grid),
        torch.randn(s.batch, s.seq_k, s.d_model),
        s.padding(s.seq_k),
    )


def fmap(s: Sizes) -> tuple:
    return (torch.randn(s.batch, s.d_model, *s.grid),)


def dit_inputs(s: Sizes) -> tuple:
    """Latents, diffusion timesteps and class labels."""
    return (
        torch.randn(s.batch, s.in_channels, *s.image),
        torch.rand(s.batch) * 1000,
        torch.arange(s.batch) % 10,
    )


def joint_inputs(s: Sizes) -> tuple:
    """Image latents and text token embeddings."""
    return torch.randn(s.batch, s.in_channels, *s.image), torch.randn(s.batch, s.seq_k, s.d_model)


class CrossAttention(nn.Module):
    """stable-diffusion's CrossAttention: heads folded into the batch with einops."""

    def __init__(self, d_model, heads, bug=None):
        super().__init__()
        self.heads, self.scale, self.bug = heads, (d_model // heads) ** -0.5, bug
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_k = nn.Linear(d_model, d_model, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x, context=None, mask=None):
        h = self.heads
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=h) for t in (q, k, v))
        sim = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale
        if mask is not None:
            if self.bug == "spatial_mask_repeat":
                mask = repeat(mask, "b j -> (h b) () j", h=h)  # <- spatial_mask_repeat
            else:
                mask = repeat(mask, "b j -> (b h) () j", h=h)
            fill = -torch.finfo(sim.dtype).max
            sim = sim.masked_fill(~mask, fill)  # <- spatial_mask_repeat (where it bites)
        axis = -2 if self.bug == "spatial_softmax_queries" else -1
        attn = sim.softmax(dim=axis)  # <- spatial_softmax_queries
        out = torch.einsum("b i j, b j d -> b i d", attn, v)
        if self.bug == "spatial_fold_order":
            out = rearrange(out, "(h b) n d -> b n (h d)", h=h)  # <- spatial_fold_order
        else:
            out = rearrange(out, "(b h) n d -> b n (h d)", h=h)
        return self.to_out(out)


class SpatialTransformer(nn.Module):
    """stable-diffusion's SpatialTransformer: norm, proj_in, self- and cross-attention on the
    image tokens, proj_out (zero-initialised), residual."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.norm = nn.GroupNorm(s.heads, d)
        self.proj_in = nn.Conv2d(d, d, 1)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn1 = CrossAttention(d, s.heads, bug)
        self.attn2 = CrossAttention(d, s.heads, bug)
        self.proj_out = zero_module(nn.Conv2d(d, d, 1))

    def forward(self, x, context, mask):
        b, c, h, w = x.shape
        x_in = x
        x = self.proj_in(self.norm(x))
        if self.bug == "spatial_tokens_reshape":
            x = x.reshape(b, h * w, c)  # <- spatial_tokens_reshape
        else:
            x = rearrange(x, "b c h w -> b (h w) c")
        x = x + self.attn1(self.norm1(x))
        x = x + self.attn2(self.norm2(x), context, mask)
        if self.bug == "spatial_out_reshape":
            x = x.reshape(b, c, h, w)  # <- spatial_out_reshape
        else:
            x = rearrange(x, "b (h w) c -> b c h w", h=h, w=w)
        return self.proj_out(x) + x_in


class LegacyAttentionBlock(nn.Module):
    """guided-diffusion's AttentionBlock with QKVAttentionLegacy: [batch * heads, channels,
    tokens] einsums, qkv from a 1x1 conv, proj_out zero-initialised."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.heads, self.bug = s.heads, bug
        self.norm = nn.GroupNorm(s.heads, d)
        self.qkv = nn.Conv1d(d, 3 * d, 1)
        self.proj_out = zero_module(nn.Conv1d(d, d, 1))

    def attention(self, qkv):
        bs, width, length = qkv.shape
        ch = width // (3 * self.heads)
        q, k, v = qkv.reshape(bs * self.heads, ch * 3, length).split(ch, dim=1)
        scale = 1 / math.sqrt(math.sqrt(ch))
        weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        if self.bug == "legacy_softmax_queries":
            weight = torch.softmax(weight, dim=1)  # <- legacy_softmax_queries
        else:
            weight = torch.softmax(weight, dim=-1)
        if self.bug == "legacy_einsum_transposed":
            a = torch.einsum("bst,bcs->bct", weight, v)  # <- legacy_einsum_transposed
        else:
            a = torch.einsum("bts,bcs->bct", weight, v)
        return a.reshape(bs, -1, length)

    def forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        h = self.attention(self.qkv(self.norm(x)))
        return (x + self.proj_out(h)).reshape(b, c, *spatial)


def modulate(x, shift, scale, bug=None):
    if bug == "dit_modulate_tokens":
        return x * (1 + scale.unsqueeze(0)) + shift.unsqueeze(0)  # <- dit_modulate_tokens
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """A DiT: patchify, timestep and label embedding, one adaLN-Zero block, the final layer
    and unpatchify."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.heads, self.patch, self.channels, self.bug = s.heads, s.patch, s.in_channels, bug
        self.x_embed = nn.Conv2d(s.in_channels, d, s.patch, stride=s.patch)
        self.t_embed = nn.Sequential(nn.Linear(32, d), nn.SiLU(), nn.Linear(d, d))
        self.y_embed = nn.Embedding(10, d)
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.adaLN = nn.Sequential(nn.SiLU(), zero_module(nn.Linear(d, 3 * d)))
        self.norm_final = nn.LayerNorm(d, elementwise_affine=False)
        self.final_adaLN = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.final = nn.Linear(d, s.patch * s.patch * s.in_channels)

    def timestep(self, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(16, dtype=t.dtype) / 16)
        args = t[:, None] * freqs[None]
        return self.t_embed(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))

    def attention(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> (b h) n d", h=self.heads) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        if self.bug == "dit_fold_order":
            out = rearrange(out, "(h b) n d -> b n (h d)", h=self.heads)  # <- dit_fold_order
        else:
            out = rearrange(out, "(b h) n d -> b n (h d)", h=self.heads)
        return self.proj(out)

    def unpatchify(self, x, gh, gw):
        N, p, c = x.shape[0], self.patch, self.channels
        if self.bug == "dit_unpatchify":
            return x.reshape(N, c, gh * p, gw * p)  # <- dit_unpatchify
        x = x.reshape(N, gh, gw, p, p, c)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(N, c, gh * p, gw * p)

    def forward(self, img, t, y):
        x = self.x_embed(img)
        gh, gw = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)  # [B, N, d]
        c = self.timestep(t) + self.y_embed(y)
        shift, scale, gate = self.adaLN(c).chunk(3, dim=1)
        x = x + gate.unsqueeze(1) * self.attention(modulate(self.norm1(x), shift, scale, self.bug))
        shift, scale = self.final_adaLN(c).chunk(2, dim=1)
        x = self.final(modulate(self.norm_final(x), shift, scale, self.bug))
        return self.unpatchify(x, gh, gw)


def rope_cache(length, d_k):
    theta = 1.0 / (10000 ** (torch.arange(0, d_k, 2).float() / d_k))
    angles = torch.outer(torch.arange(length).float(), theta)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)  # [positions, d_k / 2, 2]


def apply_rope(x, cache):
    """Rotary on [B, T, heads, d_k] (lit-llama's layout): positions on axis 1."""
    T = x.size(1)
    xs = x.reshape(*x.shape[:-1], -1, 2)
    c = cache[:T].view(1, T, 1, xs.size(3), 2)
    out = torch.stack(
        [
            xs[..., 0] * c[..., 0] - xs[..., 1] * c[..., 1],  # <- joint_rope_after_transpose
            xs[..., 1] * c[..., 0] + xs[..., 0] * c[..., 1],  # <- joint_rope_after_transpose
        ],
        -1,
    )
    return out.flatten(3)


class JointAttention(nn.Module):
    """MMDiT (SD3, Flux) joint attention: text and image streams with their own projections,
    rotary on the joint sequence, one attention over text then image tokens, split back."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.heads, self.d_k, self.bug = s.heads, s.d_k + s.d_k % 2, bug
        inner = self.heads * self.d_k
        self.x_embed = nn.Conv2d(s.in_channels, d, s.patch, stride=s.patch)
        self.img_qkv, self.txt_qkv = nn.Linear(d, 3 * inner), nn.Linear(d, 3 * inner)
        self.img_out, self.txt_out = nn.Linear(inner, d), nn.Linear(inner, d)
        self.register_buffer("rope", rope_cache(s.tokens + s.seq_k + 1, self.d_k), persistent=False)

    def split(self, qkv):
        B, L, _ = qkv.shape
        return qkv.view(B, L, 3, self.heads, self.d_k).unbind(2)  # 3 x [B, L, heads, d_k]

    def forward(self, img, txt):
        x = self.x_embed(img).flatten(2).transpose(1, 2)  # [B, N, d]
        B, N, S = x.shape[0], x.shape[1], txt.shape[1]
        (qi, ki, vi), (qt, kt, vt) = self.split(self.img_qkv(x)), self.split(self.txt_qkv(txt))
        # Text first, then image, along the tokens of [B, L, heads, d_k].
        cat = 2 if self.bug == "joint_cat_axis" else 1
        q = torch.cat((qt, qi), dim=cat)  # <- joint_cat_axis
        k = torch.cat((kt, ki), dim=cat)  # <- joint_cat_axis
        v = torch.cat((vt, vi), dim=cat)  # <- joint_cat_axis
        if self.bug == "joint_rope_after_transpose":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = apply_rope(q, self.rope)  # <- joint_rope_after_transpose
            k = apply_rope(k, self.rope)  # <- joint_rope_after_transpose
        else:
            q, k = apply_rope(q, self.rope), apply_rope(k, self.rope)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)  # [B, heads, S + N, d_k]
        out = out.transpose(1, 2).reshape(B, -1, self.heads * self.d_k)
        if self.bug == "joint_split_order":
            img_out, txt_out = out[:, :N], out[:, N:]  # <- joint_split_order
        else:
            txt_out, img_out = out[:, :S], out[:, S:]
        return self.img_out(img_out), self.txt_out(txt_out)
