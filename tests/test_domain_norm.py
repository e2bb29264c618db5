"""Attention weights normalised over one token axis and summed over another (issue 32).

Image, diffusion and graph attention, written from scratch after public code: a spatial
self-attention on conv-feature-map tokens (stable-diffusion's SpatialTransformer),
guided-diffusion's legacy and new-order QKV attention ([batch * heads, channels, tokens],
scores by an einsum of the transposed layout), a dense graph attention (pyGAT), slot
attention (Locatello et al.), cross-covariance attention (XCiT) and linear attention
(Shen et al.). A softmax over the queries of self-attention is `softmax_axis` at the
softmax, whatever the tokens are named; a product that sums the weights over another axis
than the one they sum to 1 along is `aggregation_axis` at the product. One bug, one
finding; the correct counterparts, channels-last and sequence-first spellings included,
are silent at the three size settings.
"""

import math
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trace_helpers import describe, findings

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose


@dataclass(frozen=True)
class Setting:
    name: str
    batch: int
    heads: int
    d_k: int
    grid: tuple[int, int]  # a feature map's height and width: its tokens
    slots: int

    @property
    def channels(self) -> int:
        return self.heads * self.d_k

    @property
    def tokens(self) -> int:
        return self.grid[0] * self.grid[1]


SETTINGS = [
    Setting("distinct", 3, 4, 16, (5, 7), 6),
    Setting("coincident", 4, 4, 4, (2, 2), 4),  # batch == heads == d_k == tokens == slots
    Setting("realistic", 4, 8, 64, (8, 8), 7),
]
SETTING = pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.name)


def only(found, kind: str):
    assert [f.kind for f in found] == [kind], describe(found)
    return found[0]


# -- 1. image tokens from a conv feature map ---------------------------------------------
class SpatialSelfAttention(nn.Module):
    """Self-attention over the pixels of a [B, C, H, W] map (or [B, H, W, C] when
    `channels_last`), its output added back onto the map."""

    def __init__(self, channels, n_heads, bug=None, channels_last=False):
        super().__init__()
        self.h, self.d_k, self.bug = n_heads, channels // n_heads, bug
        self.channels_last = channels_last
        self.to_qkv = nn.Linear(channels, 3 * channels)
        self.out = nn.Linear(channels, channels)

    def forward(self, x):
        if self.channels_last:
            B, H, W, C = x.shape
            t = x.reshape(B, H * W, C)
        else:
            B, C, H, W = x.shape
            t = x.flatten(2).transpose(1, 2)  # [B, H*W, C]
        q, k, v = self.to_qkv(t).view(B, H * W, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / self.d_k**0.5  # [B, heads, HW, HW]
        attn = scores.softmax(dim=-2 if self.bug == "softmax" else -1)
        weights = attn.transpose(-2, -1) if self.bug == "aggregate" else attn
        out = (weights @ v).transpose(1, 2).reshape(B, H * W, C)
        out = self.out(out)
        if self.channels_last:
            return x + out.reshape(B, H, W, C)
        return x + out.transpose(1, 2).reshape(B, C, H, W)


def feature_map(s: Setting, channels_last=False):
    shape = (s.batch, *s.grid, s.channels) if channels_last else (s.batch, s.channels, *s.grid)
    return torch.randn(shape)


@SETTING
def test_softmax_over_the_queries_of_image_tokens_is_found_at_the_softmax(s):
    torch.manual_seed(0)
    found = findings(SpatialSelfAttention(s.channels, s.heads, "softmax"), feature_map(s))
    finding = only(found, "softmax_axis")
    assert finding.relation == (
        "softmax over the queries' height*width (dim -2) of scores: each query's weights "
        "must sum to 1 over the keys (height*width, dim -1)"
    )
    assert finding.source == 'attn = scores.softmax(dim=-2 if self.bug == "softmax" else -1)'
    assert "softmax(scores, dim=-1)" in finding.hint


@SETTING
def test_image_tokens_summed_over_the_queries_are_found_at_the_product(s):
    torch.manual_seed(0)
    found = findings(SpatialSelfAttention(s.channels, s.heads, "aggregate"), feature_map(s))
    finding = only(found, "aggregation_axis")
    n = s.tokens
    assert finding.relation == (
        f"weights @ v sums weights over dim -1 (height*width={n}), but its softmax made it "
        f"sum to 1 over dim -2 (height*width={n}): each output must be a weighted sum over "
        "the axis its weights sum to 1 along"
    )
    assert finding.source == "out = (weights @ v).transpose(1, 2).reshape(B, H * W, C)"
    assert [o.name for o in finding.operands] == ["weights", "v"]
    assert "weights.transpose(-2, -1) in this product" in finding.hint
    assert "drop the transpose that laid it out" in finding.hint


@SETTING
@pytest.mark.parametrize("channels_last", [False, True], ids=["channels_first", "channels_last"])
def test_spatial_self_attention_is_silent(s, channels_last):
    torch.manual_seed(0)
    model = SpatialSelfAttention(s.channels, s.heads, channels_last=channels_last)
    assert findings(model, feature_map(s, channels_last)) == []


@SETTING
def test_channels_last_image_tokens_summed_over_the_queries_are_found(s):
    torch.manual_seed(0)
    model = SpatialSelfAttention(s.channels, s.heads, "aggregate", channels_last=True)
    only(findings(model, feature_map(s, channels_last=True)), "aggregation_axis")


# -- 2. guided-diffusion's QKV attention ---------------------------------------------------
class QKVAttention(nn.Module):
    """guided-diffusion's attention block: GroupNorm, a 1x1 conv to qkv, attention on
    [batch * heads, channels, tokens], a 1x1 conv back. `legacy`: heads split before q, k
    and v (QKVAttentionLegacy); else after (QKVAttention), the scale in one place each."""

    def __init__(self, channels, n_heads, legacy=True, bug=None):
        super().__init__()
        self.n_heads, self.legacy, self.bug = n_heads, legacy, bug
        self.norm = nn.GroupNorm(n_heads, channels)
        self.qkv = nn.Conv1d(channels, 3 * channels, 1)
        self.proj = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        b, c, *spatial = x.shape
        x = x.reshape(b, c, -1)
        qkv = self.qkv(self.norm(x))
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        scale = 1 / math.sqrt(math.sqrt(ch))
        if self.legacy:
            q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
            weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
        else:
            q, k, v = qkv.chunk(3, dim=1)
            weight = torch.einsum(
                "bct,bcs->bts",
                (q * scale).view(bs * self.n_heads, ch, length),
                (k * scale).view(bs * self.n_heads, ch, length),
            )
            v = v.reshape(bs * self.n_heads, ch, length)
        weight = torch.softmax(weight.float(), dim=1 if self.bug == "softmax" else -1)
        weight = weight.type(weight.dtype)
        equation = "bst,bcs->bct" if self.bug == "aggregate" else "bts,bcs->bct"
        a = torch.einsum(equation, weight, v)
        h = a.reshape(bs, -1, length)
        return (x + self.proj(h)).reshape(b, c, *spatial)


LEGACY = pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "new_order"])


@SETTING
@LEGACY
def test_a_transposed_qkv_aggregation_is_found_with_its_subscripts(s, legacy):
    torch.manual_seed(0)
    found = findings(QKVAttention(s.channels, s.heads, legacy, "aggregate"), feature_map(s))
    finding = only(found, "aggregation_axis")
    assert finding.relation.startswith("einsum 'bst,bcs->bct' sums weight over dim -2 (")
    assert "but its softmax made it sum to 1 over dim -1 (" in finding.relation
    assert finding.source == "a = torch.einsum(equation, weight, v)"
    assert finding.hint.startswith("write 'bts,bcs->bct', which sums weight over the axis")


@SETTING
@LEGACY
def test_a_qkv_softmax_over_the_queries_is_found_at_the_softmax(s, legacy):
    torch.manual_seed(0)
    found = findings(QKVAttention(s.channels, s.heads, legacy, "softmax"), feature_map(s))
    finding = only(found, "softmax_axis")
    assert finding.relation.startswith("softmax over the queries' ")
    assert "(dim -2) of weight.float(): each query's weights must sum to 1" in finding.relation
    assert "dim=-1" in finding.hint


@SETTING
@LEGACY
def test_qkv_attention_is_silent(s, legacy):
    torch.manual_seed(0)
    assert findings(QKVAttention(s.channels, s.heads, legacy), feature_map(s)) == []


@SETTING
def test_qkv_attention_on_a_sequence_is_silent(s):
    """The same block on a [B, C, T] sequence (a 1-D U-Net, audio)."""
    torch.manual_seed(0)
    x = torch.randn(s.batch, s.channels, s.tokens)
    assert findings(QKVAttention(s.channels, s.heads), x) == []
    only(findings(QKVAttention(s.channels, s.heads, bug="aggregate"), x), "aggregation_axis")


# -- 3. dense graph attention ----------------------------------------------------------------
class DenseGAT(nn.Module):
    """pyGAT's GraphAttentionLayer: e = LeakyReLU(Wh a1 + (Wh a2)^T) over [nodes, nodes],
    the non-edges pushed to -9e15, softmax over each node's neighbours, then attn @ Wh."""

    def __init__(self, d_in, d_out, bug=None):
        super().__init__()
        self.bug = bug
        self.W = nn.Parameter(torch.randn(d_in, d_out) / math.sqrt(d_in))
        self.a = nn.Parameter(torch.randn(2 * d_out, 1) / math.sqrt(d_out))
        self.d_out = d_out

    def forward(self, h, adj):
        Wh = torch.mm(h, self.W)  # [nodes, d_out]
        Wh1 = torch.matmul(Wh, self.a[: self.d_out, :])
        Wh2 = torch.matmul(Wh, self.a[self.d_out :, :])
        e = F.leaky_relu(Wh1 + Wh2.T, 0.2)  # [nodes, nodes]
        zero_vec = -9e15 * torch.ones_like(e)
        attention = torch.where(adj > 0, e, zero_vec)
        attention = F.softmax(attention, dim=0 if self.bug == "softmax" else 1)
        attention = F.dropout(attention, 0.1, training=self.training)
        if self.bug == "aggregate":
            return torch.matmul(attention.T, Wh)
        return torch.matmul(attention, Wh)


def graph(s: Setting):
    nodes = s.tokens
    adj = (torch.rand(nodes, nodes) < 0.5) | torch.eye(nodes, dtype=torch.bool)
    return torch.randn(nodes, s.channels), adj.float()


@SETTING
def test_a_graph_softmax_over_the_wrong_side_is_found_at_the_product(s):
    torch.manual_seed(0)
    found = findings(DenseGAT(s.channels, s.d_k, "softmax").eval(), *graph(s))
    finding = only(found, "aggregation_axis")
    assert finding.relation.startswith("attention @ Wh sums attention over dim -1 (")
    assert "but its softmax made it sum to 1 over dim -2 (" in finding.relation
    assert finding.source == "return torch.matmul(attention, Wh)"
    assert finding.hint.endswith("or normalise attention along dim -1 instead")


@SETTING
def test_a_transposed_graph_aggregation_is_found(s):
    torch.manual_seed(0)
    found = findings(DenseGAT(s.channels, s.d_k, "aggregate").eval(), *graph(s))
    finding = only(found, "aggregation_axis")
    assert finding.relation.startswith("attention^T @ Wh sums attention^T over dim -1 (")
    assert finding.hint.startswith("sum attention^T over dim -2, the axis its weights sum to 1")
    assert "(swap its dims -2 and -1 in this product or drop the transpose" in finding.hint


@SETTING
def test_a_dense_graph_attention_is_silent(s):
    torch.manual_seed(0)
    assert findings(DenseGAT(s.channels, s.d_k).eval(), *graph(s)) == []


# -- 4. slot attention: a softmax over the queries, renormalised over the keys ---------------
class SlotAttention(nn.Module):
    """Locatello et al.: slots compete for the inputs (softmax over the slots), then each
    slot takes the weighted mean of the inputs (renormalised over them). `sampled`: slots
    drawn around a learned mean; else learned slots broadcast to the batch."""

    def __init__(self, dim, n_slots, iters=2, sampled=True, bug=None):
        super().__init__()
        self.n_slots, self.iters, self.sampled, self.bug = n_slots, iters, sampled, bug
        self.scale = dim**-0.5
        self.mu = nn.Parameter(torch.randn(1, 1, dim))
        self.log_sigma = nn.Parameter(torch.zeros(1, 1, dim))
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim) for _ in range(3))
        self.gru = nn.GRUCell(dim, dim)
        self.norm_inputs, self.norm_slots = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, inputs):
        b, n, d = inputs.shape
        mu = self.mu.expand(b, self.n_slots, -1)
        slots = mu + self.log_sigma.exp() * torch.randn(mu.shape) if self.sampled else mu
        inputs = self.norm_inputs(inputs)
        k, v = self.to_k(inputs), self.to_v(inputs)
        for _ in range(self.iters):
            previous = slots
            q = self.to_q(self.norm_slots(slots))
            dots = torch.einsum("bid,bjd->bij", q, k) * self.scale
            attn = dots.softmax(dim=1) + 1e-8
            if self.bug != "unnormalised":
                attn = attn / attn.sum(dim=-1, keepdim=True)
            updates = torch.einsum("bjd,bij->bid", v, attn)
            slots = self.gru(updates.reshape(-1, d), previous.reshape(-1, d)).reshape(b, -1, d)
        return slots


SAMPLED = pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "learned"])


@SETTING
@SAMPLED
def test_slot_attention_is_silent(s, sampled):
    torch.manual_seed(0)
    model = SlotAttention(s.channels, s.slots, sampled=sampled)
    assert findings(model, torch.randn(s.batch, s.tokens, s.channels)) == []


@SETTING
@SAMPLED
def test_slot_attention_without_its_renormalisation_is_found(s, sampled):
    torch.manual_seed(0)
    model = SlotAttention(s.channels, s.slots, sampled=sampled, bug="unnormalised")
    found = findings(model, torch.randn(s.batch, s.tokens, s.channels))
    finding = only(found, "aggregation_axis")  # once for the line, both iterations
    assert finding.relation.startswith("einsum 'bjd,bij->bid' sums attn over dim -1 (")
    assert f"sum to 1 over dim -2 (size {s.slots})" in finding.relation
    assert finding.hint.endswith(
        "where the weights are meant to compete over the queries (slot attention), renormalise "
        "attn along dim -1 before this product (attn / attn.sum(dim=-1, keepdim=True))"
    )


# -- 5. cross-covariance and linear attention ------------------------------------------------
class XCA(nn.Module):
    """XCiT's cross-covariance attention: a softmax over a [channels, channels] matrix."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.temperature = nn.Parameter(torch.ones(n_heads, 1, 1))
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k, v = q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1)  # [B, h, d, N]
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        attn = attn.softmax(dim=-1)
        x = (attn @ v).permute(0, 3, 1, 2).reshape(B, N, C)
        return self.proj(x)


class LinearAttention(nn.Module):
    """Efficient attention (Shen et al.): q normalised over its features, k over the
    positions, k^T v first."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = (
            t.view(B, N, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)
        )
        q, k = q.softmax(dim=-1), k.softmax(dim=-2)
        context = k.transpose(-2, -1) @ v  # [B, h, d, d]
        out = (q @ context).transpose(1, 2).reshape(B, N, C)
        return self.out(out)


@SETTING
@pytest.mark.parametrize("cls", [XCA, LinearAttention], ids=lambda c: c.__name__)
def test_softmaxes_over_features_are_silent(s, cls):
    torch.manual_seed(0)
    assert findings(cls(s.channels, s.heads), torch.randn(s.batch, s.tokens, s.channels)) == []


# -- 6. text: the softmax's own message; sequence-first; cross-attention ---------------------
class SeqFirst(nn.Module):
    """fairseq style: [T, B, C] in, heads folded into the batch, bmm."""

    def __init__(self, dim, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x):
        T, B, C = x.shape
        d = C // self.n_heads

        def fold(t):
            return t.contiguous().view(T, B * self.n_heads, d).transpose(0, 1)

        q, k, v = fold(self.q(x) * d**-0.5), fold(self.k(x)), fold(self.v(x))
        weights = torch.bmm(q, k.transpose(1, 2)).softmax(dim=1 if self.bug == "softmax" else -1)
        if self.bug == "aggregate":
            weights = weights.transpose(1, 2)
        out = torch.bmm(weights, v)  # [B * heads, T, d]
        return out.transpose(0, 1).contiguous().view(T, B, C)


@SETTING
def test_sequence_first_attention(s):
    torch.manual_seed(0)
    x = torch.randn(s.tokens, s.batch, s.channels)
    assert findings(SeqFirst(s.channels, s.heads), x) == []
    softmax = only(findings(SeqFirst(s.channels, s.heads, "softmax"), x), "softmax_axis")
    assert softmax.relation.startswith("softmax over seq_q (dim -2) of ")
    summed = only(findings(SeqFirst(s.channels, s.heads, "aggregate"), x), "aggregation_axis")
    assert summed.relation.startswith("bmm(weights, v) sums weights over dim -1 (seq_q=")


class CrossAttention(nn.Module):
    def __init__(self, dim, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))

    def forward(self, x, memory):
        B, T, C = x.shape
        S = memory.shape[1]
        q = self.q(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        k = self.k(memory).view(B, S, self.n_heads, -1).transpose(1, 2)
        v = self.v(memory).view(B, S, self.n_heads, -1).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        attn = scores.softmax(dim=-2 if self.bug == "softmax" else -1)
        return (attn @ v).transpose(1, 2).reshape(B, T, C)


@SETTING
def test_cross_attention_softmax_over_the_queries_is_found_at_the_product(s):
    """Queries that are no keys: the softmax over them could be renormalised after it (as
    slot attention does), so the product with V decides, once."""
    torch.manual_seed(0)
    x = torch.randn(s.batch, s.slots, s.channels)
    memory = torch.randn(s.batch, s.tokens, s.channels)
    assert findings(CrossAttention(s.channels, s.heads), x, memory) == []
    found = findings(CrossAttention(s.channels, s.heads, "softmax"), x, memory)
    finding = only(found, "aggregation_axis")
    assert finding.relation.startswith("attn @ v sums attn over dim -1 (seq_k=")
    assert finding.hint.startswith("take the softmax along the keys (dim -1), or")


def test_text_self_attention_keeps_its_softmax_message():
    torch.manual_seed(0)
    model = SeqFirst(32, 4, "softmax")
    found = findings(model, torch.randn(7, 3, 32))
    assert [f.kind for f in found] == ["softmax_axis"]  # not aggregation_axis as well


# -- 7. the verdict survives a replay ----------------------------------------------------------
def test_a_replayed_forward_finds_the_same():
    """From the third trace of one model on, recorded steps are replayed: the weights'
    normalised side is a fact of their meta, so the product is judged the same."""
    torch.manual_seed(0)
    model = QKVAttention(16, 4, bug="aggregate")
    x = torch.randn(3, 16, 5, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        traces = [shapeguard.trace(model, x, mode="warn") for _ in range(3)]
    assert traces[0]._replayed == 0 and traces[2]._replayed > 0
    assert [[f.kind for f in t.findings] for t in traces] == [["aggregation_axis"]] * 3
    model = SlotAttention(16, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        traces = [shapeguard.trace(model, torch.randn(3, 9, 16)) for _ in range(3)]
    assert [t.findings for t in traces] == [[], [], []]
