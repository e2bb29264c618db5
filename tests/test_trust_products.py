"""Products claim only what their structure establishes (issue 26).

Correct idioms that were reported as bugs, each in at least two code styles at the three size
settings of the zoo (distinct, coincident, realistic), with no finding; next to each, the bug
it resembles, still found, with a hint that fixes it:

- an einsum read by its letters, not by positions: `bihd,bjhd->bhij` keeps the heads in axis 2
  and pairs the tokens (Funnel, XLNet, einops with words); `bhid,bhjd->bhij` on the same
  `[B, S, H, D]` tensors pairs the heads (`layout_bshd`, with the letters that fix it);
- DeepSeek-MLA's absorbed attention: `q_nope @ W_uk` with a weight that is not a parameter
  (a buffer, an attribute) is a projection, not a query-key product, at any latent rank;
- a state-space decode step's `bmm(state, C)` (Mamba-2) is a state times a vector, not
  attention: no `scores`, no `seq_q` on the state's head_dim;
- an einsum that lays the keys before the queries (`... -> ... j i`, x-transformers) then
  `softmax(dim=-1)`: the hint names the einsum and its corrected subscripts, never "use
  dim=-1", which the code already does;
- sequence-first `[S, B, E]` attention written with bmm (fairseq, ESM): no finding.
"""

import warnings

import bug_zoo as zoo
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trace_helpers import describe, trace, x_of

import shapeguard
from shapeguard import ShapeWarning

pytestmark = pytest.mark.no_shapeguard  # each test traces its own model

SETTINGS = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)


# -- einsum subscripts are read before positions -----------------------------------------------
class EinsumHeadsKept(nn.Module):
    """q, k, v split to [batch, seq, heads, d_k] and never transposed: the einsum's letters
    keep the heads apart and pair the tokens."""

    def __init__(self, d_model, n_heads, scores_eq, context_eq):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.scores_eq, self.context_eq = scores_eq, context_eq
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.W_q(x).view(B, S, self.n_heads, self.d_k)
        k = self.W_k(x).view(B, S, self.n_heads, self.d_k)
        v = self.W_v(x).view(B, S, self.n_heads, self.d_k)
        scores = torch.einsum(self.scores_eq, q, k) * self.d_k**-0.5
        attn = scores.softmax(dim=-1)
        context = torch.einsum(self.context_eq, attn, v)
        return self.W_o(context.reshape(B, S, -1))


class FunnelRelative(nn.Module):
    """Funnel's content score: `q_head + r_w_bias` against k_head, heads kept as a batch
    letter (`bind,bjnd->bnij`)."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_head, self.d_head = n_heads, d_model // n_heads
        self.q_head = nn.Linear(d_model, d_model, bias=False)
        self.k_head = nn.Linear(d_model, d_model)
        self.v_head = nn.Linear(d_model, d_model)
        self.r_w_bias = nn.Parameter(torch.zeros(n_heads, self.d_head))
        self.post_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        batch_size, seq_len, _ = x.shape
        shape = [batch_size, seq_len, self.n_head, self.d_head]
        q_head = self.q_head(x).view(shape)
        k_head = self.k_head(x).view(shape)
        v_head = self.v_head(x).view(shape)
        q_head = q_head * self.d_head**-0.5
        content_score = torch.einsum("bind,bjnd->bnij", q_head + self.r_w_bias, k_head)
        attn_prob = torch.softmax(content_score, dim=-1)
        attn_vec = torch.einsum("bnij,bjnd->bind", attn_prob, v_head)
        return self.post_proj(attn_vec.reshape(batch_size, seq_len, -1))


class XLNetRelative(nn.Module):
    """XLNet's content score, sequence-first: `[seq, batch, heads, d_k]` and
    `ibnd,jbnd->bnij`."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_head, self.d_head = n_heads, d_model // n_heads
        self.q = nn.Parameter(torch.randn(d_model, n_heads, self.d_head) * d_model**-0.5)
        self.k = nn.Parameter(torch.randn(d_model, n_heads, self.d_head) * d_model**-0.5)
        self.v = nn.Parameter(torch.randn(d_model, n_heads, self.d_head) * d_model**-0.5)
        self.o = nn.Parameter(torch.randn(d_model, n_heads, self.d_head) * d_model**-0.5)

    def forward(self, h):  # [seq, batch, d_model]
        q_head_h = torch.einsum("ibh,hnd->ibnd", h, self.q)
        k_head_h = torch.einsum("ibh,hnd->ibnd", h, self.k)
        v_head_h = torch.einsum("ibh,hnd->ibnd", h, self.v)
        ac = torch.einsum("ibnd,jbnd->bnij", q_head_h, k_head_h)
        attn_prob = F.softmax(ac * self.d_head**-0.5, dim=3)
        attn_vec = torch.einsum("bnij,jbnd->ibnd", attn_prob, v_head_h)
        return torch.einsum("ibnd,hnd->ibh", attn_vec, self.o)


class EinopsWords(nn.Module):
    """einops.einsum with words for axes; heads kept in axis 2."""

    def __init__(self, d_model, n_heads, bug=False):
        super().__init__()
        self.n_heads, self.d_k, self.bug = n_heads, d_model // n_heads, bug
        self.to_qkv = nn.Linear(d_model, 3 * d_model)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x):
        import einops

        B, S, _ = x.shape
        q, k, v = (t.view(B, S, self.n_heads, self.d_k) for t in self.to_qkv(x).chunk(3, dim=-1))
        if self.bug:  # the letters of [batch, heads, seq, d_k] on [batch, seq, heads, d_k]
            sim = einops.einsum(q, k, "b h i d, b h j d -> b h i j")
            attn = sim.softmax(dim=-1)
            out = einops.einsum(attn, v, "b h i j, b h j d -> b h i d")
        else:
            sim = einops.einsum(q, k, "batch i heads d, batch j heads d -> batch heads i j")
            attn = sim.softmax(dim=-1)
            out = einops.einsum(attn, v, "batch heads i j, batch j heads d -> batch i heads d")
        return self.to_out(out.reshape(B, S, -1))


HEADS_KEPT = {
    "bihd": lambda s: EinsumHeadsKept(s.d_model, s.heads, "bihd,bjhd->bhij", "bhij,bjhd->bihd"),
    "bqhd": lambda s: EinsumHeadsKept(s.d_model, s.heads, "bqhd,bkhd->bhqk", "bhqk,bkhd->bqhd"),
    "spaced": lambda s: EinsumHeadsKept(
        s.d_model, s.heads, "b i h d, b j h d -> b h i j", "b h i j, b j h d -> b i h d"
    ),
    "funnel": lambda s: FunnelRelative(s.d_model, s.heads),
    "einops_words": lambda s: EinopsWords(s.d_model, s.heads),
}


@SETTINGS
@pytest.mark.parametrize("style", HEADS_KEPT)
def test_einsum_keeping_the_heads_in_axis_2_gives_no_finding(style, sizes):
    torch.manual_seed(0)
    found = trace(HEADS_KEPT[style](sizes), x_of(sizes)).findings
    assert found == [], describe(found)


@SETTINGS
def test_sequence_first_einsum_of_xlnet_gives_no_finding(sizes):
    torch.manual_seed(0)
    h = torch.randn(sizes.seq, sizes.batch, sizes.d_model)
    found = trace(XLNetRelative(sizes.d_model, sizes.heads), h).findings
    assert found == [], describe(found)


def _einsum_bug(s):
    return EinsumHeadsKept(s.d_model, s.heads, "bhid,bhjd->bhij", "bhij,bhjd->bhid")


@SETTINGS
@pytest.mark.parametrize(
    ("make", "fixed"),
    [
        (_einsum_bug, "'bihd,bjhd->bhij'"),
        (lambda s: EinopsWords(s.d_model, s.heads, bug=True), "'b i h d, b j h d -> b h i j'"),
    ],
    ids=["torch_einsum", "einops_einsum"],
)
def test_einsum_with_the_letters_of_bhsd_on_bshd_is_layout_bshd(make, fixed, sizes):
    """The real bug next to the idiom: the letters say [batch, heads, seq, d_k], the tensors
    are [batch, seq, heads, d_k], so the product pairs the heads of each token."""
    torch.manual_seed(0)
    found = trace(make(sizes), x_of(sizes)).findings
    assert [f.kind for f in found] == ["layout_bshd"], describe(found)
    (finding,) = found
    assert finding.message.startswith("sim = einsum" if "i h" in fixed else "scores = einsum")
    assert (
        f"the product pairs the {sizes.heads} heads of each token with each other instead of "
        f"the {sizes.seq} tokens" in finding.message
    )
    assert fixed in finding.hint, finding.hint
    assert "transpose(1, 2)" in finding.hint


# -- DeepSeek-MLA's absorbed attention ------------------------------------------------------------
class AbsorbedMLA(nn.Module):
    """MLA with the up-projection of k absorbed into q (DeepSeek's "absorb" inference): the
    scores contract the latent rank of q @ W_uk with the compressed kv. `weights` says where
    W_uk and W_uv come from: views of kv_b's weight, or precomputed tensors kept as a buffer
    or a plain attribute (vLLM's W_UK_T)."""

    def __init__(self, d_model, n_heads, d_nope, d_rope, rank, style, weights):
        super().__init__()
        self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim = n_heads, d_nope, d_rope
        self.kv_lora_rank, self.v_head_dim = rank, d_nope
        self.style, self.weights = style, weights
        self.q_proj = nn.Linear(d_model, n_heads * (d_nope + d_rope))
        self.kv_a_proj = nn.Linear(d_model, rank + d_rope)
        self.kv_norm = nn.LayerNorm(rank)
        self.kv_b_proj = nn.Linear(rank, n_heads * 2 * d_nope, bias=False)
        self.o_proj = nn.Linear(n_heads * d_nope, d_model)
        w = self.kv_b_proj.weight.detach().view(n_heads, 2 * d_nope, rank)
        if weights == "buffer":
            self.register_buffer("W_uk", w[:, :d_nope].clone())
            self.register_buffer("W_uv", w[:, d_nope:].clone())
        elif weights == "attribute":
            self.W_uk, self.W_uv = w[:, :d_nope].clone(), w[:, d_nope:].clone()

    def absorbed(self):
        if self.weights == "view":
            w = self.kv_b_proj.weight.view(self.num_heads, -1, self.kv_lora_rank)
            return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]
        return self.W_uk, self.W_uv

    def forward(self, x):
        B, S, _ = x.shape
        H, d, r, c = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        q = self.q_proj(x).view(B, S, H, d + r)
        q_nope, q_pe = q.split([d, r], dim=-1)
        kv, k_pe = self.kv_a_proj(x).split([c, r], dim=-1)
        kv = self.kv_norm(kv)  # [B, T, c]
        W_uk, W_uv = self.absorbed()  # [H, d, c], [H, d_v, c]
        scale = (d + r) ** -0.5
        if self.style == "einsum":
            q_abs = torch.einsum("bshd,hdc->bshc", q_nope, W_uk)
            scores = torch.einsum("bshc,btc->bsht", q_abs, kv)
            scores = (scores + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * scale
            attn = scores.softmax(dim=-1)
            context = torch.einsum("bsht,btc->bshc", attn, kv)
            out = torch.einsum("bshc,hdc->bshd", context, W_uv)
            return self.o_proj(out.reshape(B, S, -1))
        if self.style == "matmul":
            q_abs = torch.matmul(q_nope.transpose(1, 2), W_uk)  # [B, H, S, c]
        else:  # bmm over the heads, tokens flattened (vLLM)
            q_abs = torch.bmm(q_nope.reshape(B * S, H, d).transpose(0, 1), W_uk)  # [H, B*S, c]
            q_abs = q_abs.transpose(0, 1).reshape(B, S, H, c).transpose(1, 2)
        kv_t = kv.unsqueeze(1).transpose(-1, -2)  # [B, 1, c, T]
        scores = q_abs @ kv_t + q_pe.transpose(1, 2) @ k_pe.unsqueeze(1).transpose(-1, -2)
        attn = (scores * scale).softmax(dim=-1)
        context = attn @ kv.unsqueeze(1)  # [B, H, S, c]
        out = context @ W_uv.transpose(-1, -2)  # [B, H, S, d_v]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


@SETTINGS
@pytest.mark.parametrize("rank", ["rank_is_d_k", "rank_apart"])
@pytest.mark.parametrize("weights", ["view", "buffer", "attribute"])
@pytest.mark.parametrize("style", ["einsum", "matmul", "bmm"])
def test_absorbed_mla_gives_no_finding(style, weights, rank, sizes):
    latent = sizes.d_k if rank == "rank_is_d_k" else 2 * sizes.d_k + 3
    torch.manual_seed(0)
    model = AbsorbedMLA(sizes.d_model, sizes.heads, sizes.d_k, 8, latent, style, weights)
    found = trace(model, x_of(sizes)).findings
    assert found == [], describe(found)


@pytest.mark.parametrize("style", ["matmul", "bmm"])
def test_q_times_an_absorbed_weight_is_not_a_query_key_product(style):
    """What the fix rests on: q @ W_uk makes no scores, and the latent rank it leaves is
    not a token axis; the product with the compressed kv is the query-key product."""
    s = zoo.DISTINCT
    torch.manual_seed(0)
    model = AbsorbedMLA(s.d_model, s.heads, s.d_k, 8, s.d_k, style, "buffer")
    t = trace(model, x_of(s))
    products = [e for e in t.events if e.op in ("matmul", "bmm")]
    absorbed = [e for e in products if e.label == "q_abs"]
    assert absorbed and all(e.role != "scores" for e in absorbed), [e.role for e in absorbed]
    latent = [e.outputs[0].axes[-1] for e in absorbed]
    assert all(name is None or "seq" not in name for name in latent), latent
    # q_abs @ kv^T and q_pe @ k_pe^T, summed into the scores: two query-key products.
    assert [e.role for e in products].count("scores") == 2, [e.role for e in products]


# -- a state-space decode step --------------------------------------------------------------------
class SSMDecodeStep(nn.Module):
    """One Mamba-2 decode step as transformers writes it (selective_state_update): the state
    [batch, heads, head_dim, state] times C [batch, heads, state, 1], by bmm (or matmul).

    The state comes from a cache object, so its axes are new to the trace, and in the update
    its head_dim meets only the copies `dt` was expanded to: nothing says what it is. (A
    state built in the module from the projection's head split, or updated in another
    order, has its head_dim known as features, and the old rule stayed silent there: the
    provenance of the cached state, not the product, decided.)"""

    def __init__(self, d_model, heads, head_dim, state, style):
        super().__init__()
        self.num_heads, self.head_dim, self.ssm_state_size = heads, head_dim, state
        self.style = style
        self.in_proj = nn.Linear(d_model, heads * head_dim + 2 * state + heads)
        self.A_log = nn.Parameter(torch.zeros(heads))
        self.dt_bias = nn.Parameter(torch.zeros(heads))
        self.D = nn.Parameter(torch.ones(heads))
        self.out_proj = nn.Linear(heads * head_dim, d_model)

    def forward(self, x, cache):
        B, H, P, N = x.shape[0], self.num_heads, self.head_dim, self.ssm_state_size
        xs, Bm, Cm, dt = self.in_proj(x.squeeze(1)).split([H * P, N, N, H], dim=-1)
        hidden_states = xs.view(B, H, P)
        state = cache.states[0]
        A = -torch.exp(self.A_log.float())[:, None, None].expand(-1, P, N)
        dt = dt[:, :, None].expand(-1, -1, P)
        dt = F.softplus(dt + self.dt_bias[:, None].expand(-1, P))[..., None]
        dA = torch.exp(dt * A)
        B_ = Bm.reshape(B, 1, 1, N).expand(B, 1, H, N).reshape(B, H, 1, N)
        dBx = dt * B_ * hidden_states[..., None]
        state = state * dA + dBx
        cache.states[0] = state
        C = Cm.reshape(B, 1, 1, N).expand(B, 1, H, N).contiguous().reshape(B, H, N)
        batch_size, num_heads, head_dim = hidden_states.shape
        if self.style == "bmm":
            out = torch.bmm(
                state.view(batch_size * num_heads, head_dim, N),
                C.view(batch_size * num_heads, N, 1),
            )
        else:
            out = torch.matmul(state, C[..., None])
        out = out.view(batch_size, num_heads, head_dim)
        out = out + hidden_states * self.D[:, None]
        return self.out_proj(out.reshape(B, 1, H * P))


class Cache:
    def __init__(self, state):
        self.states = [state]


@SETTINGS
@pytest.mark.parametrize("style", ["bmm", "matmul"])
def test_ssm_decode_step_is_not_attention(style, sizes):
    head_dim, state = sizes.d_k, 16 if sizes.d_k != 16 else 12
    torch.manual_seed(0)
    model = SSMDecodeStep(sizes.d_model, sizes.heads, head_dim, state, style)
    cache = Cache(torch.randn(sizes.batch, sizes.heads, head_dim, state))
    t = trace(model, torch.randn(sizes.batch, 1, sizes.d_model), cache)
    assert t.findings == [], describe(t.findings)
    products = [e for e in t.events if e.op in ("bmm", "matmul")]
    assert products and all(e.role != "scores" for e in products)
    shapes = [e.outputs[0].named_shape for e in products]
    assert all("seq" not in shape for shape in shapes), shapes


def test_a_one_token_query_against_its_keys_is_still_a_query_key_product():
    """The counterpart: one query against many keys (a decode step of attention) has a key
    axis, so it stays scores."""
    s = zoo.DISTINCT
    torch.manual_seed(0)
    q = torch.randn(s.batch * s.heads, 1, s.d_k)
    k = torch.randn(s.batch * s.heads, s.seq_k, s.d_k)

    def step(q, k):
        scores = torch.bmm(q, k.transpose(1, 2))
        return scores.softmax(dim=-1)

    t = trace(step, q, k)
    assert [e.role for e in t.events if e.op == "bmm"] == ["scores"]


def test_mamba2_generate_gives_no_finding():
    """The model-level reproducer of the field report: transformers' Mamba-2, whose decode
    steps read the state the prefill left in the cache."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Mamba2Config(
        hidden_size=64,
        num_hidden_layers=2,
        vocab_size=128,
        num_heads=4,
        head_dim=32,
        n_groups=1,
        state_size=16,
        expand=2,
        chunk_size=8,
    )
    torch.manual_seed(0)
    model = transformers.Mamba2ForCausalLM(config).eval()
    ids = torch.randint(0, 128, (3, 7))
    with torch.no_grad():
        plain = model.generate(ids, max_new_tokens=3, do_sample=False)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        with shapeguard.trace(mode="warn") as t:
            traced = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(plain, traced)
    assert t.findings == [], describe(t.findings)


# -- an einsum that lays the keys before the queries ---------------------------------------------
class XTransformersAttend(nn.Module):
    """x-transformers' attend: `einsum(f"{q_eq}, {k_eq} -> {out}")` then softmax(dim=-1)."""

    def __init__(self, d_model, n_heads, scores_eq):
        super().__init__()
        self.heads, self.scores_eq = n_heads, scores_eq
        self.to_qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x):
        from einops import rearrange

        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in (q, k, v))
        if self.scores_eq == "einops":  # einops' einsum, with words
            import einops

            sim = einops.einsum(q, k, "batch heads i d, batch heads j d -> batch heads j i")
            sim = sim * q.shape[-1] ** -0.5
        else:
            sim = torch.einsum(self.scores_eq, q, k) * q.shape[-1] ** -0.5
        attn = sim.softmax(dim=-1)
        out = torch.einsum("b h i j, b h j d -> b h i d", attn, v)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


@SETTINGS
@pytest.mark.parametrize(
    ("transposed", "fixed"),
    [
        ("b h i d, b h j d -> b h j i", "'b h i d, b h j d -> b h i j'"),
        ("... i d, ... j d -> ... j i", "'... i d, ... j d -> ... i j'"),
        ("einops", "'batch heads i d, batch heads j d -> batch heads i j'"),
    ],
    ids=["letters", "ellipsis", "einops_words"],
)
def test_keys_laid_first_by_an_einsum_get_the_einsum_fixed_not_the_softmax(
    transposed, fixed, sizes
):
    torch.manual_seed(0)
    found = trace(XTransformersAttend(sizes.d_model, sizes.heads, transposed), x_of(sizes))
    found = found.findings
    assert [f.kind for f in found] == ["softmax_axis"], describe(found)
    (finding,) = found
    assert finding.message.startswith("softmax over seq_q (dim -1) of sim")
    assert "use softmax" not in finding.hint
    if transposed == "einops":
        transposed = "batch heads i d, batch heads j d -> batch heads j i"
    assert (
        f"sim is [batch, heads, seq_k, seq_q]: the einsum '{transposed}' that made it puts the "
        f"keys at dim -2 and the queries last; write {fixed} and keep softmax(..., dim=-1)"
    ) == finding.hint


@SETTINGS
@pytest.mark.parametrize(
    "scores_eq", ["b h i d, b h j d -> b h i j", "... i d, ... j d -> ... i j"]
)
def test_the_einsum_with_the_queries_first_gives_no_finding(scores_eq, sizes):
    torch.manual_seed(0)
    found = trace(XTransformersAttend(sizes.d_model, sizes.heads, scores_eq), x_of(sizes))
    assert found.findings == [], describe(found.findings)


# -- sequence-first attention written with bmm ----------------------------------------------------
class FairseqAttention(nn.Module):
    """fairseq's MultiheadAttention (and ESM's), [tgt_len, bsz, embed] in and out, heads
    folded into the batch for bmm; `packed` is the in_proj_weight form, `bias_kv` appends a
    learned key and value, `rotary` is ESM's rotation on [bsz * heads, len, head_dim]."""

    def __init__(self, embed_dim, num_heads, packed=False, bias_kv=False, rotary=False):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.packed, self.rotary = packed, rotary
        if packed:
            self.in_proj_weight = nn.Parameter(torch.randn(3 * embed_dim, embed_dim) * 0.1)
            self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        else:
            self.q_proj = nn.Linear(embed_dim, embed_dim)
            self.k_proj = nn.Linear(embed_dim, embed_dim)
            self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.bias_k = nn.Parameter(torch.randn(1, 1, embed_dim)) if bias_kv else None
        self.bias_v = nn.Parameter(torch.randn(1, 1, embed_dim)) if bias_kv else None
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def rotate(self, x):
        seq_len, dim = x.shape[1], x.shape[2]
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.einsum("i,j->ij", torch.arange(seq_len).type_as(inv_freq), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * emb.cos()[None] + torch.cat((-x2, x1), dim=-1) * emb.sin()[None]

    def forward(self, query, key=None, key_padding_mask=None, attn_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        key = query if key is None else key  # [src_len, bsz, embed]: a memory
        if self.packed:
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            q, k, v = self.q_proj(query), self.k_proj(key), self.v_proj(key)
        q = q * self.scaling
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = torch.cat([v, self.bias_v.repeat(1, bsz, 1)])
            if attn_mask is not None:
                attn_mask = torch.cat([attn_mask, attn_mask.new_zeros(attn_mask.size(0), 1)], 1)
            if key_padding_mask is not None:
                extra = key_padding_mask.new_zeros(key_padding_mask.size(0), 1)
                key_padding_mask = torch.cat([key_padding_mask, extra], dim=1)
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        if self.rotary:
            q, k = self.rotate(q), self.rotate(k)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            attn_weights += attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            hidden = key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool)
            attn_weights = attn_weights.masked_fill(hidden, float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_probs = F.softmax(attn_weights, dim=-1)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        weights = attn_probs.view(bsz, self.num_heads, tgt_len, src_len).mean(dim=1)
        return self.out_proj(attn), weights


class SeqFirstLayer(nn.Module):
    def __init__(self, d_model, n_heads, causal=False, cross=False, **options):
        super().__init__()
        self.self_attn = FairseqAttention(d_model, n_heads, **options)
        self.cross_attn = FairseqAttention(d_model, n_heads) if cross else None
        self.norm = nn.LayerNorm(d_model)
        self.causal = causal

    def forward(self, x, padding=None, memory=None):
        T = x.size(0)
        mask = torch.triu(torch.full((T, T), float("-inf")), 1) if self.causal else None
        h, _ = self.self_attn(x, key_padding_mask=padding, attn_mask=mask)
        x = self.norm(x + h)
        if self.cross_attn is not None:  # memory: [src_len, bsz, embed], an input of its own
            h, _ = self.cross_attn(x, memory)
            x = x + h
        return x


SEQ_FIRST = {
    "fairseq": {},
    "fairseq_packed": {"packed": True},
    "fairseq_bias_kv_causal": {"bias_kv": True, "causal": True},
    "esm_rotary": {"rotary": True},
    # bsz is read from the query and folds the memory's batch with the heads.
    "fairseq_cross": {"cross": True},
}


@SETTINGS
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("style", SEQ_FIRST)
def test_sequence_first_bmm_attention_gives_no_finding(style, padded, sizes):
    options = SEQ_FIRST[style]
    d_k = sizes.rope_d_k if options.get("rotary") else sizes.d_k
    torch.manual_seed(0)
    model = SeqFirstLayer(sizes.heads * d_k, sizes.heads, **options)
    x = torch.randn(sizes.seq, sizes.batch, sizes.heads * d_k)
    padding = (zoo.attention_mask(sizes) == 0) if padded else None
    memory = (
        torch.randn(sizes.seq_k, sizes.batch, sizes.heads * d_k) if "cross" in options else None
    )
    found = trace(model, x, padding, memory).findings
    assert found == [], describe(found)


# -- a kind from the input's usual layout alone decides no contraction ---------------------------
class ChannelPooling(nn.Module):
    """A query from a conditioning vector meets the channels of a [batch, channels, length]
    feature map (attention pooling over channels). The input's usual layout reads axis 1 as
    positions; nothing in the code says so, and the product is right."""

    def __init__(self, cond, channels, style):
        super().__init__()
        self.to_q = nn.Linear(cond, channels)
        self.style = style

    def forward(self, x, z):
        q = self.to_q(z)  # [batch, channels]
        if self.style == "bmm":
            weights = torch.bmm(q.unsqueeze(1), x)  # [batch, 1, length]
        else:
            weights = torch.einsum("bc,bcl->bl", q, x)
        return weights.softmax(dim=-1)


@SETTINGS
@pytest.mark.parametrize("style", ["bmm", "einsum"])
def test_a_product_against_an_axis_only_the_input_layout_names_gives_no_finding(style, sizes):
    """contraction_axes needs each contracted axis's kind established: by a parameter or
    structure, or by identity with an axis the other operand keeps (`q @ k` without the
    transpose contracts the very positions q's rows run along: still found, see the zoo's
    `contraction` bugs in tests/test_invariants.py)."""
    torch.manual_seed(0)
    model = ChannelPooling(7, sizes.d_model, style)
    x = torch.randn(sizes.batch, sizes.d_model, sizes.seq)
    found = trace(model, x, torch.randn(sizes.batch, 7)).findings
    assert found == [], describe(found)


# -- the operand order of a query-key product ----------------------------------------------------
class KeysTimesQueries(nn.Module):
    """The scores written keys first, softmax over the keys: correct, and the operand order
    (which is all that says the left operand holds the queries) is no evidence here."""

    def __init__(self, d_model, n_heads, style):
        super().__init__()
        self.heads, self.style = n_heads, style
        self.to_q = nn.Linear(d_model, d_model)
        self.to_k = nn.Linear(d_model, d_model)
        self.to_v = nn.Linear(d_model, d_model)

    def forward(self, x):
        from einops import rearrange

        q = rearrange(self.to_q(x), "b n (h d) -> b h n d", h=self.heads)
        k = rearrange(self.to_k(x), "b n (h d) -> b h n d", h=self.heads)
        v = rearrange(self.to_v(x), "b n (h d) -> b h n d", h=self.heads)
        if self.style == "einsum":
            sim = torch.einsum("bhjd,bhid->bhij", k, q)  # [b, h, query, key]
            attn = sim.softmax(dim=-1)
            out = torch.einsum("bhij,bhjd->bhid", attn, v)
        else:
            sim = torch.matmul(k, q.transpose(-2, -1))  # [b, h, key, query]
            attn = sim.softmax(dim=-2)
            out = attn.transpose(-2, -1) @ v
        return rearrange(out, "b h n d -> b n (h d)")


@SETTINGS
@pytest.mark.parametrize("style", ["einsum", "matmul"])
def test_keys_times_queries_gives_no_finding(style, sizes):
    torch.manual_seed(0)
    found = trace(KeysTimesQueries(sizes.d_model, sizes.heads, style), x_of(sizes)).findings
    assert found == [], describe(found)
