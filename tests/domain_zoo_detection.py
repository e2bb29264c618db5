"""Detection in the domain zoo: a DETR decoder layer (seq-first nn.MultiheadAttention over a
backbone feature map) and Deformable DETR's multi-scale deformable attention (the PyTorch
reference path, grid_sample over two levels)."""

import torch
import torch.nn.functional as F
from domain_zoo_sizes import Sizes
from torch import nn

LEVELS, POINTS = 2, 3


def detr_inputs(s: Sizes) -> tuple:
    """A projected backbone feature map and DETR's pixel mask (True = padding), padded on the
    right for every image but the first."""
    real_columns = s.padding(s.grid[1])  # [B, gw], True = real
    mask = ~real_columns[:, None, :].expand(-1, s.grid[0], -1)
    return torch.randn(s.batch, s.d_model, *s.grid), mask


def deform_inputs(s: Sizes) -> tuple:
    """Object queries, their reference points per level in [0, 1], and two feature levels."""
    gh, gw = s.grid
    return (
        torch.randn(s.batch, s.seq, s.d_model),
        torch.rand(s.batch, s.seq, LEVELS, 2),
        torch.randn(s.batch, s.d_model, 2 * gh, 2 * gw),
        torch.randn(s.batch, s.d_model, gh, gw),
    )


class DETRDecoder(nn.Module):
    """DETR's decoder layer (post-norm): learned queries, learned row/column positions, self-
    attention among the queries, cross-attention to the flattened feature map."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.bug = bug
        self.query_embed = nn.Embedding(s.seq, d)
        self.row_embed, self.col_embed = nn.Embedding(50, d // 2), nn.Embedding(50, d // 2)
        self.self_attn = nn.MultiheadAttention(d, s.heads)
        self.cross_attn = nn.MultiheadAttention(d, s.heads)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def position(self, h, w):
        """[d, h, w] from learned column and row embeddings (DETR's PositionEmbeddingLearned)."""
        cols = self.col_embed.weight[:w][None, :, :].expand(h, -1, -1)
        rows = self.row_embed.weight[:h][:, None, :].expand(-1, w, -1)
        return torch.cat([cols, rows], dim=-1).permute(2, 0, 1)

    def forward(self, features, mask):
        B, d, h, w = features.shape
        pos = self.position(h, w).unsqueeze(0).expand(B, -1, -1, -1)
        if self.bug == "detr_batch_first":
            memory = features.flatten(2).transpose(1, 2)  # <- detr_batch_first
            pos = pos.flatten(2).transpose(1, 2)
            query_pos = self.query_embed.weight.unsqueeze(0).repeat(B, 1, 1)
        else:
            memory = features.flatten(2).permute(2, 0, 1)  # [HW, B, d]
            pos = pos.flatten(2).permute(2, 0, 1)
            query_pos = self.query_embed.weight.unsqueeze(1).repeat(1, B, 1)  # [Q, B, d]
        padding = mask.flatten(1)  # [B, HW], True = padding
        if self.bug == "detr_mask_polarity":
            padding = ~padding  # <- detr_mask_polarity
        tgt = torch.zeros_like(query_pos)
        q = k = tgt + query_pos
        tgt = self.norm1(tgt + self.self_attn(q, k, tgt)[0])  # <- detr_batch_first
        attended = self.cross_attn(  # <- detr_batch_first, detr_mask_polarity
            tgt + query_pos, memory + pos, memory, key_padding_mask=padding
        )[0]
        tgt = self.norm2(tgt + attended)
        return tgt if self.bug == "detr_batch_first" else tgt.transpose(0, 1)


class DeformAttn(nn.Module):
    """MSDeformAttn: per query, head, level and point a learned offset around the reference
    point and a weight (softmax over each head's levels x points); bilinear samples of the
    value, weighted and summed."""

    def __init__(self, s: Sizes, bug=None):
        super().__init__()
        d = s.d_model
        self.heads, self.d_k, self.bug = s.heads, s.d_k, bug
        self.sampling_offsets = nn.Linear(d, s.heads * LEVELS * POINTS * 2)
        self.attention_weights = nn.Linear(d, s.heads * LEVELS * POINTS)
        self.value_proj, self.output_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, query, reference_points, *maps):
        B, Lq, _ = query.shape
        h, dk = self.heads, self.d_k
        shapes = [tuple(m.shape[-2:]) for m in maps]
        src = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], dim=1)  # [B, S, d]
        S = src.shape[1]
        if self.bug == "deform_value_heads":
            value = self.value_proj(src).view(B, h, S, dk).transpose(1, 2)  # <- deform_value_heads
        else:
            value = self.value_proj(src).view(B, S, h, dk)
        if self.bug == "deform_offsets_view":
            offsets = self.sampling_offsets(query)
            offsets = offsets.view(B, h, Lq, LEVELS, POINTS, 2)  # <- deform_offsets_view
            offsets = offsets.transpose(1, 2)
        else:
            offsets = self.sampling_offsets(query).view(B, Lq, h, LEVELS, POINTS, 2)
        if self.bug == "deform_weights_softmax":
            weights = self.attention_weights(query).softmax(-1)  # <- deform_weights_softmax
            weights = weights.view(B, Lq, h, LEVELS, POINTS)
        else:
            weights = self.attention_weights(query).view(B, Lq, h, LEVELS * POINTS)
            weights = weights.softmax(-1).view(B, Lq, h, LEVELS, POINTS)
        normalizer = torch.tensor([[w, hh] for hh, w in shapes], dtype=query.dtype)
        locations = (
            reference_points[:, :, None, :, None, :]
            + offsets / normalizer[None, None, None, :, None, :]
        )
        grids = 2 * locations - 1
        sampled = []
        for level, (hh, w) in enumerate(shapes):
            start = sum(a * b for a, b in shapes[:level])
            value_l = (
                value[:, start : start + hh * w]
                .flatten(2)
                .transpose(1, 2)
                .reshape(B * h, dk, hh, w)
            )
            grid_l = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)  # [B*h, Lq, P, 2]
            sampled.append(F.grid_sample(value_l, grid_l, mode="bilinear", align_corners=False))
        weights = weights.transpose(1, 2).reshape(B * h, 1, Lq, LEVELS * POINTS)
        weighted = torch.stack(sampled, dim=-2).flatten(-2) * weights  # [B*h, d_k, Lq, L*P]
        out = weighted.sum(-1).view(B, h * dk, Lq)  # <- deform_weights_softmax (summed here)
        return self.output_proj(out.transpose(1, 2))
