"""Multi-query and grouped-query attention whose keys have no heads axis (issue 32).

PaLM-style blocks (also x-transformers, lucidrains' repositories) project the queries to
`[batch, heads, seq, d_k]` and one shared key and value head `[batch, seq, d_k]`, and write
the scores as `einsum("b h i d, b j d -> b h i j")`. The heads letter on the query side only
is the evidence that the keys are shared by the heads: with it the product is scores, and
the rules see the chain (softmax axis, the heads merge). An einsum with two query-side
letters of which structure singles out no head split claims nothing.
"""

import bug_zoo as zoo
import einops
import pytest
import torch
from bug_zoo import Sizes
from torch import nn
from trace_helpers import describe, trace, x_of

pytestmark = pytest.mark.no_shapeguard  # each test traces its own model

SETTINGS = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
SPELLINGS = pytest.mark.parametrize(
    "scores_eq, context_eq",
    [
        ("b h i d, b j d -> b h i j", "b h i j, b j d -> b h i d"),
        ("bhid,bjd->bhij", "bhij,bjd->bhid"),
        ("einops: b h i d, b j d -> b h i j", "einops: b h i j, b j d -> b h i d"),
    ],
    ids=["spaced", "compact", "einops"],
)


class MultiQuery(nn.Module):
    """Queries per head, one key and value head shared by all (PaLM)."""

    def __init__(self, d_model, n_heads, d_k, scores_eq, context_eq, bug=None):
        super().__init__()
        self.n_heads, self.d_k, self.bug = n_heads, d_k, bug
        self.scores_eq, self.context_eq = scores_eq, context_eq
        self.to_q = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.to_k = nn.Linear(d_model, d_k, bias=False)
        self.to_v = nn.Linear(d_model, d_k, bias=False)
        self.to_out = nn.Linear(n_heads * d_k, d_model, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.to_q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)  # [B, h, S, d]
        k, v = self.to_k(x), self.to_v(x)  # [B, S, d]: one head for all
        sim = self.einsum(self.scores_eq, q, k) * self.d_k**-0.5
        attn = sim.softmax(dim=-2 if self.bug == "softmax_axis" else -1)
        if self.bug == "aggregate_queries":  # sums over the queries, not the keys
            out = torch.einsum("b h i j, b i d -> b h j d", attn, v)
        else:
            out = self.einsum(self.context_eq, attn, v)  # [B, h, S, d]
        if self.bug == "merge":
            out = out.reshape(B, S, self.n_heads * self.d_k)
        else:
            out = out.transpose(1, 2).reshape(B, S, self.n_heads * self.d_k)
        return self.to_out(out)

    @staticmethod
    def einsum(equation, a, b):
        """torch.einsum, or einops.einsum (its words, the pattern last) for "einops: ..."."""
        if equation.startswith("einops: "):
            return einops.einsum(a, b, equation.removeprefix("einops: "))
        return torch.einsum(equation, a, b)


class GroupedQuery(nn.Module):
    """Grouped-query attention: `groups` key heads, `n_heads` query heads in each group."""

    def __init__(self, d_model, groups, n_heads, d_k, bug=None):
        super().__init__()
        self.groups, self.n_heads, self.d_k, self.bug = groups, n_heads, d_k, bug
        self.to_q = nn.Linear(d_model, groups * n_heads * d_k, bias=False)
        self.to_kv = nn.Linear(d_model, 2 * groups * d_k, bias=False)
        self.to_out = nn.Linear(groups * n_heads * d_k, d_model, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.to_q(x).view(B, S, self.groups, self.n_heads, self.d_k).permute(0, 2, 3, 1, 4)
        k, v = self.to_kv(x).view(B, S, 2, self.groups, self.d_k).permute(2, 0, 3, 1, 4)
        sim = torch.einsum("b g h i d, b g j d -> b g h i j", q, k) * self.d_k**-0.5
        attn = sim.softmax(dim=-2 if self.bug == "softmax_axis" else -1)
        out = torch.einsum("b g h i j, b g j d -> b g h i d", attn, v)
        out = out.permute(0, 3, 1, 2, 4).reshape(B, S, -1)
        return self.to_out(out)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PaLMParallelBlock(nn.Module):
    """PaLM's parallel block (after lucidrains' PaLM-pytorch): one fused projection for
    multi-query attention and the feed-forward, rotary on q and the shared k, a causal
    mask laid on the multi-query scores."""

    def __init__(self, dim, dim_head, heads, bug=None):
        super().__init__()
        self.heads, self.scale, self.bug = heads, dim_head**-0.5, bug
        self.norm = nn.LayerNorm(dim)
        self.fused_dims = (dim_head * heads, dim_head, dim_head, dim * 4)
        self.register_buffer("inv_freq", 10000 ** -(torch.arange(0, dim_head, 2) / dim_head))
        self.fused_attn_ff_proj = nn.Linear(dim, sum(self.fused_dims), bias=False)
        self.attn_out = nn.Linear(dim_head * heads, dim, bias=False)
        self.ff_out = nn.Sequential(nn.SiLU(), nn.Linear(dim * 4, dim, bias=False))

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v, ff = self.fused_attn_ff_proj(self.norm(x)).split(self.fused_dims, dim=-1)
        q = q.view(b, n, self.heads, -1).transpose(1, 2)  # [b, h, n, d]; k, v: [b, n, d]
        freqs = torch.einsum("i , j -> i j", torch.arange(n).float(), self.inv_freq)
        pos = torch.cat((freqs, freqs), dim=-1)
        q, k = ((t * pos.cos()) + (rotate_half(t) * pos.sin()) for t in (q, k))
        sim = torch.einsum("b h i d, b j d -> b h i j", q * self.scale, k)
        causal_mask = torch.ones((n, n), dtype=torch.bool)
        causal_mask = causal_mask.tril(-1) if self.bug == "mask_direction" else causal_mask.triu(1)
        attn = sim.masked_fill(causal_mask, -torch.finfo(sim.dtype).max).softmax(dim=-1)
        out = torch.einsum("b h i j, b j d -> b h i d", attn, v)
        return self.attn_out(out.transpose(1, 2).reshape(b, n, -1)) + self.ff_out(ff)


class StackedReadouts(nn.Module):
    """Two readouts stacked on a new axis and scored against one memory: the stacked axis is
    no head split of the contracted features, so nothing says the product is attention."""

    def __init__(self, d_model, d_k):
        super().__init__()
        self.read_a = nn.Linear(d_model, d_k, bias=False)
        self.read_b = nn.Linear(d_model, d_k, bias=False)
        self.memory = nn.Linear(d_model, d_k, bias=False)

    def forward(self, x):
        q = torch.stack([self.read_a(x), self.read_b(x)], dim=1)  # [B, 2, S, d]
        sim = torch.einsum("b n i d, b j d -> b n i j", q, self.memory(x))
        return sim.softmax(dim=-2)


def mq(s: Sizes, spelling, bug=None) -> MultiQuery:
    torch.manual_seed(0)
    return MultiQuery(s.d_model, s.heads, s.d_k, *spelling, bug=bug)


@SETTINGS
@SPELLINGS
def test_multi_query_scores_recognised_and_correct_code_silent(sizes, scores_eq, context_eq):
    t = trace(mq(sizes, (scores_eq, context_eq)), x_of(sizes))
    assert not t.findings, describe(t.findings)
    roles = [e.role for e in t.events if e.op == "einsum"]
    assert roles == ["scores", "context"], roles
    (scores,) = [e for e in t.events if e.role == "scores" and e.op == "einsum"]
    assert scores.outputs[0].axes == ("batch", "heads", "seq_q", "seq_k")


@SETTINGS
@SPELLINGS
def test_multi_query_softmax_over_queries_found(sizes, scores_eq, context_eq):
    t = trace(mq(sizes, (scores_eq, context_eq), "softmax_axis"), x_of(sizes))
    assert [f.kind for f in t.findings] == ["softmax_axis"], describe(t.findings)
    f = t.findings[0]
    assert "softmax over seq_q (dim -2) of sim" in f.message
    assert "over the keys (seq_k)" in f.message
    assert "dim=-1" in f.hint


@SETTINGS
@SPELLINGS
def test_multi_query_heads_merge_gets_merge_hint(sizes, scores_eq, context_eq):
    t = trace(mq(sizes, (scores_eq, context_eq), "merge"), x_of(sizes))
    assert [f.kind for f in t.findings] == ["view_mixes_axes"], describe(t.findings)
    f = t.findings[0]
    assert "merges heads back before moving them next to d_k" in f.message
    assert f"[heads={sizes.heads}, seq={sizes.seq}, d_k={sizes.d_k}]" in f.message
    assert f.hint.startswith(
        "transpose first: out.transpose(1, 2).contiguous().view(batch, seq, heads * d_k)"
    ), f.hint
    assert "patch" not in f.hint and "Conv2d" not in f.hint


@SETTINGS
@pytest.mark.parametrize("bug", [None, "aggregate_queries"])
def test_multi_query_aggregation_reads_named_weights(sizes, bug):
    """The weights-times-values einsum is context, over weights whose query and key axes
    the scores named: what a rule on the contracted axis (summed over the keys the softmax
    normalised, or over the queries) reads. Which axis it contracts is that rule's to judge
    (issue 32's "normalised over one axis, contracted over another")."""
    t = trace(
        mq(sizes, ("b h i d, b j d -> b h i j", "b h i j, b j d -> b h i d"), bug), x_of(sizes)
    )
    (context,) = [e for e in t.events if e.op == "einsum" and e.role == "context"]
    assert context.inputs[0].axes == ("batch", "heads", "seq_q", "seq_k")
    assert context.inputs[0].role == "attn"


@SETTINGS
def test_grouped_query_scores_recognised(sizes):
    torch.manual_seed(0)
    model = GroupedQuery(sizes.d_model, sizes.kv_heads, sizes.heads, sizes.d_k)
    t = trace(model, x_of(sizes))
    assert not t.findings, describe(t.findings)
    assert [e.role for e in t.events if e.op == "einsum"] == ["scores", "context"]


@SETTINGS
def test_grouped_query_softmax_over_queries_found(sizes):
    torch.manual_seed(0)
    model = GroupedQuery(sizes.d_model, sizes.kv_heads, sizes.heads, sizes.d_k, "softmax_axis")
    t = trace(model, x_of(sizes))
    assert [f.kind for f in t.findings] == ["softmax_axis"], describe(t.findings)
    assert "softmax over seq_q (dim -2) of sim" in t.findings[0].message


@SETTINGS
def test_palm_block_silent_and_causal(sizes):
    torch.manual_seed(0)
    model = PaLMParallelBlock(sizes.d_model, sizes.rope_d_k, sizes.heads)
    t = trace(model, x_of(sizes))
    assert not t.findings, describe(t.findings)
    assert [e.role for e in t.events if e.op == "einsum"][-2:] == ["scores", "context"]
    assert "softmax in PaLMParallelBlock" in str(t) and ": causal" in str(t)


@SETTINGS
def test_palm_block_mask_direction_found(sizes):
    """A mask on multi-query scores is read once the scores are recognised (main missed it)."""
    torch.manual_seed(0)
    model = PaLMParallelBlock(sizes.d_model, sizes.rope_d_k, sizes.heads, "mask_direction")
    t = trace(model, x_of(sizes))
    assert [f.kind for f in t.findings] == ["mask_direction"], describe(t.findings)
    assert "causal_mask hides the past instead of the future" in t.findings[0].message


@SETTINGS
def test_query_letters_without_a_head_split_claim_nothing(sizes):
    torch.manual_seed(0)
    t = trace(StackedReadouts(sizes.d_model, sizes.d_k), x_of(sizes))
    assert not t.findings, describe(t.findings)
    assert [e.role for e in t.events if e.op == "einsum"] == [None]
