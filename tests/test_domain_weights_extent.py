"""Weights one softmax normalised jointly over more positions than the weighted sum adds.

Deformable DETR's attention weights are one Linear output of `heads * levels * points`
per query; each head's `levels * points` weights must sum to 1, so the softmax runs after
the view that splits the heads off. Softmaxed before it, the weights sum to 1 across all
heads together; the sum over `levels * points` then leaves the heads factor (folded into
`[batch * heads]`) unsummed, and nothing fails. The trace carries the positions a softmax
normalised through views, as factors of axes (`_names/flow/extent.py`), and reports
`aggregation_axis` at the sum. Silent: the softmax after the view, a sum in two steps over
axes of their own (a soft-argmax over a heatmap), a sum over everything, attention written
as a broadcast product and a sum, at the three size settings.
"""

from dataclasses import dataclass

import pytest
import torch
from torch import nn
from trace_helpers import describe, findings

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose


@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    heads: int
    queries: int
    d_k: int
    levels: int
    points: int

    @property
    def d_model(self) -> int:
        return self.heads * self.d_k


SETTINGS = [
    Setting("distinct", 3, 4, 7, 5, 2, 3),
    Setting("coincident", 4, 4, 4, 4, 2, 2),  # batch == heads == queries == d_k == L * P
    Setting("realistic", 4, 8, 64, 64, 4, 4),
]
SETTING = pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)


class DeformWeights(nn.Module):
    """Multi-scale deformable attention's weighting (MSDeformAttn's PyTorch core), with the
    sampled values made by a Linear instead of grid_sample: `[batch * heads, d_k, queries,
    levels * points]` values times `[batch * heads, 1, queries, levels * points]` weights,
    summed over the sampling points. bug="softmax_before_view": the softmax over the flat
    `heads * levels * points` axis."""

    def __init__(self, s: Setting, bug=None):
        super().__init__()
        self.h, self.d_k, self.levels, self.points, self.bug = (
            s.heads,
            s.d_k,
            s.levels,
            s.points,
            bug,
        )
        self.attention_weights = nn.Linear(s.d_model, s.heads * s.levels * s.points)
        self.sampled = nn.Linear(s.d_model, s.d_model * s.levels * s.points)
        self.output_proj = nn.Linear(s.d_model, s.d_model)

    def forward(self, query):
        B, Lq, _ = query.shape
        h, dk, LP = self.h, self.d_k, self.levels * self.points
        sampled = self.sampled(query).view(B, Lq, h, dk, LP).permute(0, 2, 3, 1, 4)
        sampled = sampled.reshape(B * h, dk, Lq, LP)
        if self.bug == "softmax_before_view":
            weights = self.attention_weights(query).softmax(-1)
            weights = weights.view(B, Lq, h, self.levels, self.points)
        else:
            weights = self.attention_weights(query).view(B, Lq, h, LP).softmax(-1)
            weights = weights.view(B, Lq, h, self.levels, self.points)
        weights = weights.transpose(1, 2).reshape(B * h, 1, Lq, LP)
        weighted = sampled * weights
        out = weighted.sum(-1).view(B, h * dk, Lq)
        return self.output_proj(out.transpose(1, 2))


def query(s: Setting):
    return torch.randn(s.batch, s.queries, s.d_model)


@SETTING
def test_a_softmax_before_the_per_head_view_is_found_at_the_sum(s):
    torch.manual_seed(0)
    found = findings(DeformWeights(s, "softmax_before_view"), query(s))
    assert [f.kind for f in found] == ["aggregation_axis"], describe(found)
    finding = found[0]
    lp, joint = s.levels * s.points, s.heads * s.levels * s.points
    assert finding.relation == (
        f"sum over dim -1 adds {lp} of the {joint} weights one softmax normalised jointly, "
        f"and leaves a factor of size {s.heads} of dim -4 (size {s.batch * s.heads}) "
        "unsummed: each output's weights do not sum to 1"
    )
    assert finding.source == "out = weighted.sum(-1).view(B, h * dk, Lq)"
    assert [o.name for o in finding.operands] == ["weighted"]
    assert finding.hint == (
        f"take the softmax over only the {lp} weights this sum adds (view them so that the "
        f"other factor is an axis of its own, then softmax along the {lp}), or sum over all "
        f"{joint}"
    )
    assert finding.severity == "warning"


@SETTING
def test_the_softmax_after_the_per_head_view_is_silent(s):
    torch.manual_seed(0)
    assert describe(findings(DeformWeights(s), query(s))) == ""


class SoftArgmax(nn.Module):
    """Integral regression: a softmax over each heatmap's height * width, viewed back to
    [height, width] and summed with the coordinates in two steps (width, then height)."""

    def __init__(self, channels, keypoints, height, width):
        super().__init__()
        self.head = nn.Conv2d(channels, keypoints, 1)
        self.register_buffer("xs", torch.arange(width, dtype=torch.float32))
        self.h, self.w = height, width

    def forward(self, fmap):
        heat = self.head(fmap)
        B, K = heat.shape[:2]
        probs = heat.flatten(2).softmax(-1).view(B, K, self.h, self.w)
        x = (probs * self.xs).sum(-1).sum(-1)  # the rows' sums, then over the rows
        return x


@SETTING
def test_a_sum_in_two_steps_over_axes_of_their_own_is_silent(s):
    torch.manual_seed(0)
    model = SoftArgmax(s.d_k, s.heads, s.levels, s.queries)
    fmap = torch.randn(s.batch, s.d_k, s.levels, s.queries)
    assert describe(findings(model, fmap)) == ""


class BroadcastAttention(nn.Module):
    """Attention as a broadcast product and a sum, with the weights over the keys of
    [batch * heads] folded scores: the sum adds all they were normalised over."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = (t.reshape(B * self.h, T, C // self.h) for t in (q, k, v))
        attn = (q @ k.transpose(-2, -1)).softmax(-1)  # [B*h, T, T]
        out = (attn.unsqueeze(-1) * v.unsqueeze(1)).sum(2)  # [B*h, T, d_k]
        return out.view(B, self.h, T, -1).transpose(1, 2).reshape(B, T, C)


@SETTING
def test_attention_as_a_broadcast_product_and_sum_is_silent(s):
    torch.manual_seed(0)
    model = BroadcastAttention(s.d_model, s.heads)
    assert describe(findings(model, query(s))) == ""


class PooledBySoftmax(nn.Module):
    """Attention pooling over all tokens and heads at once: the sum adds everything."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.h = heads
        self.score = nn.Linear(d_model, heads)

    def forward(self, x):
        B, T, C = x.shape
        w = self.score(x).flatten(1).softmax(-1).view(B, T, self.h, 1)
        return (x.view(B, T, self.h, C // self.h) * w).sum((1, 2))


@SETTING
def test_a_sum_over_everything_the_softmax_normalised_is_silent(s):
    torch.manual_seed(0)
    assert describe(findings(PooledBySoftmax(s.d_model, s.heads), query(s))) == ""
