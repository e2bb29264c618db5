"""Head permutation reads each projection's head layout from the trace's axis provenance:
the family of layouts real models use passes, and a bug in each is caught.

Layouts: separate Q/K/V, grouped-query packed [kv groups, queries per kv + 2, d_k]
(Falcon's new decoder architecture), interleaved per head (GPT-NeoX, BLOOM), blocked
by mp_num (CodeGen), low-rank latents whose heads appear only after the up-projection
(DeepSeek's multi-head latent attention), SDPA's enable_gqa, einsum. Sizes are pairwise
distinct: batch 3, seq 5, kv heads 2, heads 6, d_k 7 (d_model 42), mp_num 3 of 2 heads.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

B, S, KV, H, DK = 3, 5, 2, 6, 7
D = H * DK  # 42
NAME = "head-permutation invariance"


def probe(model, *inputs, **kwargs):
    torch.manual_seed(1)
    report = check(model, *inputs, **kwargs)
    return next(r for r in report.results if r.name == NAME)


def x(seed=0):
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(seed))


def merge(ctx, bug):
    """[b, heads, s, d] -> [b, s, heads * d]; `bug` forgets the transpose."""
    b, h, s, d = ctx.shape
    return ctx.reshape(b, s, h * d) if bug else ctx.transpose(1, 2).reshape(b, s, h * d)


def randomized(model):
    """Every parameter drawn again (norm weights too, so none is a symmetric ones)."""
    torch.manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model


class Grouped(nn.Module):
    """Falcon's new decoder architecture: one projection viewed as [kv groups, queries
    per group + 2, d_k], the last two slots the group's key and value."""

    def __init__(self, bug=False):
        super().__init__()
        self.bug = bug
        self.num_heads, self.num_kv_heads, self.head_dim = H, KV, DK
        self.query_key_value = nn.Linear(D, (H + 2 * KV) * DK)
        self.dense = nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.query_key_value(x).view(b, s, KV, H // KV + 2, DK)
        q = qkv[:, :, :, :-2]
        k = torch.broadcast_to(qkv[:, :, :, [-2]], q.shape)
        v = torch.broadcast_to(qkv[:, :, :, [-1]], q.shape)
        q, k, v = (t.flatten(2, 3).transpose(1, 2) for t in (q, k, v))
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(merge(ctx, self.bug))


class Interleaved(nn.Module):
    """GPT-NeoX: each head's [q | k | v] together, [heads, 3 * d_k]."""

    def __init__(self, bug=False):
        super().__init__()
        self.bug = bug
        self.qkv = nn.Linear(D, 3 * D)
        self.out = nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, H, 3 * DK).transpose(1, 2)
        q, k, v = qkv.split(DK, dim=-1)
        ctx = F.softmax(q @ k.transpose(-2, -1) / DK**0.5, dim=-1) @ v
        return self.out(merge(ctx, self.bug))


class Blocked(nn.Module):
    """CodeGen: the packed projection in mp_num blocks of [q | v | k], each block
    holding heads / mp_num heads."""

    MP = 3

    def __init__(self, bug=False):
        super().__init__()
        self.bug = bug
        self.qkv_proj = nn.Linear(D, 3 * D, bias=False)
        self.out_proj = nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        local = D // self.MP
        qkv = self.qkv_proj(x).view(b, s, self.MP, 3 * local)
        q, v, k = qkv.split(local, dim=-1)
        q, v, k = (t.reshape(b, s, H, DK).transpose(1, 2) for t in (q, v, k))
        ctx = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(merge(ctx, self.bug))


class Latent(nn.Module):
    """DeepSeek's multi-head latent attention: low-rank query and key-value latents, the
    heads split only after the up-projections, a rotary key part shared by every head
    and written into a new tensor in place."""

    NOPE, ROPE, RANK = 4, 3, 9

    def __init__(self, bug=False):
        super().__init__()
        self.bug = bug
        self.q_a = nn.Linear(D, self.RANK)
        self.q_b = nn.Linear(self.RANK, H * (self.NOPE + self.ROPE), bias=False)
        self.kv_a = nn.Linear(D, self.RANK + self.ROPE)
        self.kv_norm = nn.LayerNorm(self.RANK)
        self.kv_b = nn.Linear(self.RANK, H * (self.NOPE + DK), bias=False)
        self.o = nn.Linear(H * DK, D)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_b(self.q_a(x)).view(b, s, H, self.NOPE + self.ROPE).transpose(1, 2)
        latent, k_rot = self.kv_a(x).split([self.RANK, self.ROPE], dim=-1)
        kv = self.kv_b(self.kv_norm(latent)).view(b, s, H, self.NOPE + DK).transpose(1, 2)
        k_nope, v = kv.split([self.NOPE, DK], dim=-1)
        k_rot = k_rot.view(b, 1, s, self.ROPE).expand(-1, H, -1, -1)
        k = k_nope.new_empty(b, H, s, self.NOPE + self.ROPE)
        k[..., : self.NOPE].copy_(k_nope)
        k[..., self.NOPE :].copy_(k_rot)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(merge(ctx, self.bug))


class EnableGQA(nn.Module):
    """Separate projections, fewer kv heads, SDPA repeating them (enable_gqa=True)."""

    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(D, D)
        self.wk = nn.Linear(D, KV * DK)
        self.wv = nn.Linear(D, KV * DK)
        self.wo = nn.Linear(D, D)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, H, DK).transpose(1, 2)
        k = self.wk(x).view(b, s, KV, DK).transpose(1, 2)
        v = self.wv(x).view(b, s, KV, DK).transpose(1, 2)
        ctx = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.wo(merge(ctx, False))


class Einsum(nn.Module):
    """Attention written with einsum, [batch, seq, heads, d_k] throughout; no output
    projection: the merged heads are the output."""

    def __init__(self):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (nn.Linear(D, D) for _ in range(3))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, H, DK) for f in (self.to_q, self.to_k, self.to_v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / DK**0.5
        ctx = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)
        return ctx.reshape(b, s, D)


class NormedQueries(nn.Module):
    """OLMo-2: an RMSNorm over the whole query projection (per-row weights, one per
    feature of every head), before the heads are split."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D) for _ in range(4))
        self.q_norm = nn.RMSNorm(D)
        self.k_norm = nn.RMSNorm(D)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x)).view(b, s, H, DK).transpose(1, 2)
        k = self.k_norm(self.k_proj(x)).view(b, s, H, DK).transpose(1, 2)
        v = self.v_proj(x).view(b, s, H, DK).transpose(1, 2)
        return self.o_proj(merge(F.scaled_dot_product_attention(q, k, v), False))


class Gated(nn.Module):
    """A gate on the context per head feature, before the output projection."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.g, self.o = (nn.Linear(D, D) for _ in range(5))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v, g = (
            f(x).view(b, s, H, DK).transpose(1, 2) for f in (self.q, self.k, self.v, self.g)
        )
        ctx = F.scaled_dot_product_attention(q, k, v) * torch.sigmoid(g)
        return self.o(merge(ctx, False))


class SplitBug(nn.Module):
    """`W_q(x).view(b, heads, s, d_k)`: heads carved out of the tokens."""

    def __init__(self):
        super().__init__()
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.W_q(x).view(b, H, s, DK)
        k = self.W_k(x).view(b, s, H, DK).transpose(1, 2)
        v = self.W_v(x).view(b, s, H, DK).transpose(1, 2)
        return self.W_o(merge(F.scaled_dot_product_attention(q, k, v), False))


class OneHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(D, DK) for _ in range(3))

    def forward(self, x):
        return F.scaled_dot_product_attention(self.q(x), self.k(x), self.v(x))


@pytest.mark.parametrize("cls", [Grouped, Interleaved, Blocked, Latent], ids=lambda c: c.__name__)
def test_each_packed_and_latent_layout_passes(cls):
    got = probe(randomized(cls()), x())
    assert got.status == "passed", got.message
    assert got.message.startswith(
        f"permuting the {H} heads of {cls.__name__} (Q/K/V projection rows, output projection "
        "columns) left the output unchanged (deviation "
    )


@pytest.mark.parametrize("cls", [Grouped, Interleaved, Blocked, Latent], ids=lambda c: c.__name__)
def test_a_merge_without_transpose_is_caught_in_each_layout(cls):
    got = probe(randomized(cls(bug=True)), x())
    assert got.status == "failed"
    assert got.message.startswith(
        f"permuting the {H} heads of {cls.__name__} (Q/K/V projection rows, output projection "
        "columns) moved the output by "
    )
    assert "hint: heads are not kept apart between the split and the merge" in got.message


@pytest.mark.parametrize("cls", [EnableGQA, Einsum, NormedQueries], ids=lambda c: c.__name__)
def test_grouped_query_sdpa_einsum_and_a_norm_over_the_projection_pass(cls):
    got = probe(randomized(cls()), x())
    assert got.status == "passed", got.message
    assert f"permuting the {H} heads of {cls.__name__} " in got.message


def test_the_norm_over_the_projection_is_permuted_with_its_rows():
    """Its weight lines up with the projection's output features: permuted with them
    (leaving it would move the output by a permutation of its per-feature weights)."""
    from shapeguard._probes.head_layout import plan_heads
    from shapeguard._probes.traced import trace_for_probes

    model = randomized(NormedQueries())
    with torch.no_grad():
        traced = trace_for_probes(model, (x(),), {})
    plan = plan_heads(traced.watch.heads, torch.Generator().manual_seed(0))
    assert sorted(plan.params) == [
        "k_norm.weight",
        "k_proj.bias",
        "k_proj.weight",
        "o_proj.weight",
        "q_norm.weight",
        "q_proj.bias",
        "q_proj.weight",
        "v_proj.bias",
        "v_proj.weight",
    ]


def test_a_split_that_carves_heads_out_of_the_tokens_is_caught():
    got = probe(randomized(SplitBug()), x())
    assert got.status == "failed"
    assert "Q's heads are cut across the tokens by view at " in got.message
    assert "its rows permuted as a correct split lays them out ([heads, d_k])" in got.message


def test_a_gate_on_the_context_is_not_guessed_at():
    got = probe(randomized(Gated()), x())
    assert got.status == "inconclusive" and got.applicable
    assert "its context meets another tensor at mul at " in got.message
    assert got.message.endswith(
        "before any projection reads it, so its columns are not the heads' alone"
    )


def test_one_head_is_not_applicable():
    got = probe(OneHead(), x())
    assert got.status == "skipped" and not got.applicable
    assert got.message == "every attention op runs one head: there are no heads to permute"
