"""Vision in the domain zoo: ViT, DeiT, a Swin window block and MAE random masking."""

import torch
import torch.nn.functional as F
from domain_zoo_sizes import Sizes
from torch import nn


def image(s: Sizes) -> tuple:
    return (torch.randn(s.batch, s.in_channels, *s.image),)


def swin_image(s: Sizes) -> tuple:
    side = s.window * s.patch
    return (torch.randn(s.batch, s.in_channels, s.windows[0] * side, s.windows[1] * side),)


def mae_inputs(s: Sizes) -> tuple:
    """The image and MAE's masking noise, an input as Hugging Face's ViTMAE takes it."""
    return image(s) + (torch.rand(s.batch, s.tokens),)


class Attention(nn.Module):
    """timm's Attention: one qkv projection, heads split by reshape + permute."""

    def __init__(self, d_model, heads, bug=None):
        super().__init__()
        self.heads, self.d_k, self.bug = heads, d_model // heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.d_k).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # [B, heads, N, d_k]
        attn = (q @ k.transpose(-2, -1)) * self.d_k**-0.5
        if self.bug in ("vit_softmax_queries",):
            attn = attn.softmax(dim=-2)  # <- vit_softmax_queries
        else:
            attn = attn.softmax(dim=-1)
        x = attn @ v
        if self.bug in ("vit_merge", "swin_merge"):
            x = x.reshape(B, N, C)  # <- vit_merge, swin_merge
        else:
            x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class ViT(nn.Module):
    """A ViT encoder layer: conv patch embedding, a class token, pre-norm attention."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.patch_embed = nn.Conv2d(s.in_channels, d, s.patch, stride=s.patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + s.tokens, d) * 0.02)
        self.norm = nn.LayerNorm(d)
        self.attn = Attention(d, s.heads, bug)

    def tokens(self, img):
        x = self.patch_embed(img)  # [B, C, gh, gw]
        B, C, gh, gw = x.shape
        if self.bug == "vit_patch_tokens":
            return x.reshape(B, gh * gw, C)  # <- vit_patch_tokens
        return x.flatten(2).transpose(1, 2)

    def forward(self, img):
        x = self.tokens(img)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return x + self.attn(self.norm(x))


class DeiT(ViT):
    """DeiT fine-tuned at a new resolution: class and distillation tokens, and the position
    table of a (gh + 1) x (gw + 1) pretraining grid resized to the image's grid."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__(s, bug)
        d = s.d_model
        self.trained_grid = (s.grid[0] + 1, s.grid[1] + 1)
        self.dist_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos_embed = nn.Parameter(
            torch.randn(1, 2 + self.trained_grid[0] * self.trained_grid[1], d)
        )

    def resized_pos(self, grid):
        extra, pos = self.pos_embed[:, :2], self.pos_embed[:, 2:]
        C = pos.shape[-1]
        if self.bug == "deit_pos_resize":
            pos = pos.reshape(1, C, *self.trained_grid)  # <- deit_pos_resize
        else:
            pos = pos.reshape(1, *self.trained_grid, C).permute(0, 3, 1, 2)
        pos = F.interpolate(pos, size=grid, mode="bilinear", align_corners=False)
        return torch.cat([extra, pos.flatten(2).transpose(1, 2)], dim=1)

    def forward(self, img):
        x = self.tokens(img)
        B = x.shape[0]
        grid = (
            img.shape[-2] // self.patch_embed.stride[0],
            img.shape[-1] // self.patch_embed.stride[1],
        )
        extra = [self.cls_token.expand(B, -1, -1), self.dist_token.expand(B, -1, -1)]
        x = torch.cat([*extra, x], dim=1) + self.resized_pos(grid)
        return x + self.attn(self.norm(x))


class SwinBlock(nn.Module):
    """A Swin block (no shift): patch embedding, window partition, window attention, reverse."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.window, self.bug = s.window, bug
        self.patch_embed = nn.Conv2d(s.in_channels, d, s.patch, stride=s.patch)
        self.norm = nn.LayerNorm(d)
        self.attn = Attention(d, s.heads, bug)

    def partition(self, x):
        """[B, H, W, C] -> [B * windows, w * w, C], batch-major."""
        B, H, W, C = x.shape
        w = self.window
        x = x.view(B, H // w, w, W // w, w, C)
        if self.bug == "swin_partition":
            return x.reshape(-1, w * w, C)  # <- swin_partition
        return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, C)

    def reverse(self, windows, B, H, W):
        w = self.window
        if self.bug == "swin_reverse_batch":
            x = windows.view(H // w, W // w, B, w, w, -1)  # <- swin_reverse_batch
            return x.permute(2, 0, 3, 1, 4, 5).reshape(B, H, W, -1)  # <- swin_reverse_batch
        x = windows.view(B, H // w, W // w, w, w, -1)  # <- swin_partition (where it bites)
        return x.permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)

    def forward(self, img):
        x = self.patch_embed(img)  # [B, C, H, W]
        B, C, H, W = x.shape
        x = x.flatten(2).transpose(1, 2)  # [B, H*W, C]
        shortcut = x
        windows = self.partition(self.norm(x).view(B, H, W, C))
        windows = self.attn(windows)
        x = self.reverse(windows, B, H, W).view(B, H * W, C)
        return shortcut + x


class MAE(nn.Module):
    """MAE's encoder side: patch tokens, random masking by noise, attention on the kept tokens,
    mask tokens appended and the sequence restored to patch order."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.patch_embed = nn.Conv2d(s.in_channels, d, s.patch, stride=s.patch)
        self.pos_embed = nn.Parameter(torch.randn(1, s.tokens, d) * 0.02)
        self.mask_token = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.norm = nn.LayerNorm(d)
        self.attn = Attention(d, s.heads)

    def forward(self, img, noise):
        x = self.patch_embed(img).flatten(2).transpose(1, 2) + self.pos_embed
        B, L, D = x.shape
        keep = L // 2
        if self.bug == "mae_shuffle_batch":
            ids_shuffle = torch.argsort(noise, dim=0)  # <- mae_shuffle_batch
        else:
            ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :keep]
        kept = ids_keep.unsqueeze(-1).repeat(1, 1, D)
        x = torch.gather(x, dim=1, index=kept)  # <- mae_shuffle_batch
        x = x + self.attn(self.norm(x))
        x = torch.cat([x, self.mask_token.repeat(B, L - keep, 1)], dim=1)
        index = ids_restore.unsqueeze(-1).repeat(1, 1, D)
        if self.bug == "mae_restore_gather_axis":
            return torch.gather(x, dim=2, index=index)  # <- mae_restore_gather_axis
        return torch.gather(x, dim=1, index=index)
