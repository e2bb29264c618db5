"""A probe holds, is violated, or is inconclusive with its reason (issue 26).

A probe fails only with a counterexample: an edited input that the unmodified module
runs, and outputs that moved beyond tolerance where the property says they must not.
Everything else that keeps a probe from concluding is "inconclusive", with its own
reason, and fails nothing. Each reason has a small module that shows it here, and next
to it a test where the same probe still fails a real bug. The reproducers of
research/field-reports/repro-real-repositories (minGPT's dropout in a closure,
x-transformers' cache object, nanochat's per-head gate, llama's fixed cache rows,
fairscale's NaN weights, nanoGPT's targets) and repro-domains' zero-initialised output
projection are adapted below.

The modules carry their bugs on purpose, and `check` traces them itself.
"""

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shapeguard._probes.check import check, run_probes

pytestmark = pytest.mark.no_shapeguard

# batch, heads, seq, d_k: pairwise distinct; batch == heads == seq == d_k; realistic.
SIZES = {
    "distinct": (2, 3, 5, 4),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
STYLES = ["sdpa", "matmul"]


def result(report, name):
    return next(r for r in report.results if r.name == name)


def statuses(report):
    return {r.name: r.status for r in report.results}


def reason(report, name):
    got = result(report, name)
    assert got.status == "inconclusive", report.render(width=200)
    return got.message.splitlines()[0]


def attend(q, k, v, style, *, causal=False, keep=None):
    """Attention over [batch, heads, seq, d_k], by SDPA or by hand; `keep` a bool mask."""
    if keep is None and causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if style == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return scores.softmax(dim=-1) @ v


class Attention(nn.Module):
    """Self-attention with a packed projection. `bug`: "leak" (a causal mask one key too
    wide), "merge" (heads merged without the transpose), "cumsum" (each token adds the
    tokens up to it, no position term), "mix_batch" (examples see the batch mean)."""

    def __init__(self, heads, d_k, *, style="sdpa", causal=False, bug=None):
        super().__init__()
        self.h, self.style, self.causal, self.bug = heads, style, causal, bug
        d = heads * d_k
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def heads(self, x):
        B, T, C = x.shape
        return [t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)]

    def attention(self, x):
        B, T, C = x.shape
        if self.bug == "cumsum":
            x = x + x.cumsum(dim=1) / T
        if self.bug == "mix_batch":
            x = x + x.mean(dim=0, keepdim=True)
        q, k, v = self.heads(x)
        keep = None
        if self.bug == "leak":
            keep = torch.ones(T, T, dtype=torch.bool).tril(1)
        y = attend(q, k, v, self.style, causal=self.causal, keep=keep)
        if self.bug == "merge":
            return self.out(y.reshape(B, T, C))
        return self.out(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        return self.attention(x)


def data(size, *, generator_seed=0):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(generator_seed)
    return torch.randn(b, s, h * dk)


def build(cls, size, *args, **kwargs):
    _, h, _, dk = SIZES[size]
    torch.manual_seed(0)
    return cls(h, dk, *args, **kwargs)


# -- the module rejects the edited input ----------------------------------------------------
class LearnedPositions(Attention):
    """A learned absolute position table of one length, added whole (ViT's pos_embed)."""

    def __init__(self, heads, d_k, seq, **kwargs):
        super().__init__(heads, d_k, **kwargs)
        self.pos = nn.Parameter(torch.randn(1, seq, heads * d_k))

    def forward(self, x):
        return self.attention(x + self.pos)


@functools.cache
def positions_report(size, style):
    """check of LearnedPositions at its one length: seeded, so the same report for each test
    that reads it (SDPA's is read twice), made once per process. Read only."""
    return check(build(LearnedPositions, size, SIZES[size][2], style=style), data(size))


@pytest.mark.parametrize("size", SIZES)
def test_a_length_the_module_does_not_take_is_inconclusive(size):
    report = positions_report(size, "sdpa")
    got = result(report, "length change")
    assert got.status == "inconclusive", report.render(width=200)
    assert got.message.startswith("the module rejects the probe's input (seq ")
    assert got.message.endswith("an input the module does not run is no counterexample")
    assert report.passed and report.failed == []


class FromTheEnd(Attention):
    """A causal module whose position term counts from the last token (a bug: a prefix run
    gives its tokens other positions)."""

    def __init__(self, heads, d_k, seq, **kwargs):
        super().__init__(heads, d_k, causal=True, **kwargs)
        self.pos = nn.Parameter(torch.randn(seq, heads * d_k))

    def forward(self, x):
        T = x.shape[1]
        return self.attention(x + self.pos[T - 1 - torch.arange(T)])


@pytest.mark.parametrize("size", SIZES)
def test_length_change_still_fails_positions_counted_from_the_end(size):
    seq = SIZES[size][2]
    got = result(check(build(FromTheEnd, size, seq), data(size)), "length change")
    assert got.status == "failed"
    assert got.message.startswith("running the first ")
    assert "hint: the module is causal" in got.message


class FixedRows(nn.Module):
    """A key cache of a fixed number of rows, used whole: the module takes that batch only
    (meta-llama's max_batch_size)."""

    def __init__(self, heads, d_k, batch, seq):
        super().__init__()
        self.inner = Attention(heads, d_k, causal=True)
        self.register_buffer("cache", torch.zeros(batch, seq, heads * d_k), persistent=False)

    def forward(self, x):
        B, T, _ = x.shape
        if self.cache.shape[0] != B:
            raise ValueError(f"this model was built for a batch of {self.cache.shape[0]}")
        self.cache[:, :T] = x
        return self.inner(self.cache[:, :T])


def test_a_batch_the_module_does_not_take_is_inconclusive():
    b, h, s, dk = SIZES["distinct"]
    report = check(FixedRows(h, dk, b, s), data("distinct"))
    sub = result(report, "sub-batch consistency")
    assert sub.status == "inconclusive", report.render(width=200)
    assert sub.message.startswith(f"the module rejects the probe's input (the first 1 of {b} ")
    # Causality runs one split at a time on the batch as given, which the module takes.
    assert result(report, "causality").status == "passed"
    assert result(report, "batch independence").status == "passed"
    assert report.passed


@pytest.mark.parametrize("size", SIZES)
def test_sub_batch_consistency_still_fails_examples_that_see_the_batch(size):
    got = result(
        check(build(Attention, size, bug="mix_batch"), data(size)), "sub-batch consistency"
    )
    assert got.status == "failed"
    assert "hint: an example's output depends on the batch it is in" in got.message


class OverCache(nn.Module):
    """meta-llama's cache of max_batch_size rows, sliced to the batch: more rows than it
    holds are rejected (repro-real-repositories/probe_batch_over_cache.py)."""

    def __init__(self, d=32, h=4, max_batch=4, max_seq=16, leak=False):
        super().__init__()
        self.qkv, self.out, self.h, self.leak = nn.Linear(d, 3 * d), nn.Linear(d, d), h, leak
        self.register_buffer(
            "cache_k", torch.zeros(max_batch, max_seq, h, d // h), persistent=False
        )

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h) for t in self.qkv(x).split(C, 2))
        self.cache_k[:B, :T] = k
        keys = self.cache_k[:B, :T]
        keep = torch.ones(T, T, dtype=torch.bool).tril(1 if self.leak else 0)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), v.transpose(1, 2), attn_mask=keep
        )
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_causality_runs_within_a_models_fixed_cache_rows():
    torch.manual_seed(0)
    report = check(OverCache(), torch.randn(2, 5, 32))
    got = result(report, "causality")
    assert got.status == "passed", report.render(width=200)
    assert got.message.startswith("changing tokens t..4 of x, for each t from 1 to 4, left")
    assert report.passed


def test_causality_still_fails_a_leak_within_fixed_cache_rows():
    torch.manual_seed(0)
    got = result(check(OverCache(leak=True), torch.randn(2, 5, 32)), "causality")
    assert got.status == "failed"
    assert got.message.startswith("changing tokens 1..4 of x moved the output of token 0 by ")


class Packed(nn.Module):
    """Sequences packed into one token axis with cu_seqlens (flash-attn's varlen style),
    each token attending to the earlier ones of its own sequence: cu_seqlens must cover
    the tokens, so a shorter token axis is rejected."""

    def __init__(self, heads=2, d_k=4):
        super().__init__()
        self.h = heads
        self.qkv, self.out = (
            nn.Linear(heads * d_k, 3 * heads * d_k),
            nn.Linear(heads * d_k, heads * d_k),
        )

    def forward(self, x, cu_seqlens):
        total, C = x.shape
        if int(cu_seqlens[-1]) != total:
            raise ValueError("cu_seqlens does not cover the packed tokens")
        seq = torch.searchsorted(cu_seqlens[1:], torch.arange(total), right=True)
        keep = (seq[:, None] == seq[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
        q, k, v = (
            t.view(total, self.h, C // self.h).transpose(0, 1) for t in self.qkv(x).split(C, 1)
        )
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(y.transpose(0, 1).reshape(total, C))


def test_packed_sequences_are_inconclusive_where_a_probe_cuts_the_tokens():
    torch.manual_seed(0)
    report = check(Packed(), torch.randn(9, 8), torch.tensor([0, 4, 9], dtype=torch.int32))
    got = result(report, "length change")
    assert got.status == "inconclusive", report.render(width=200)
    assert "cu_seqlens does not cover the packed tokens" in got.message.splitlines()[0]
    assert report.passed


# -- outputs that are not finite on the unmodified input --------------------------------------
class NaNWeights(Attention):
    """fairscale's parallel layers leave their weights uninitialised until a checkpoint is
    loaded: NaN here (repro-real-repositories/nan_output_check_passes.py)."""

    def __init__(self, heads, d_k, **kwargs):
        super().__init__(heads, d_k, causal=True, **kwargs)
        with torch.no_grad():
            self.qkv.weight.fill_(float("nan"))


@pytest.mark.parametrize("size", SIZES)
def test_outputs_that_are_not_finite_prove_nothing(size):
    report = check(build(NaNWeights, size), data(size))
    for name in ("batch independence", "causality", "head-permutation invariance"):
        assert reason(report, name) == (
            "the output is not finite on the unmodified input (every value NaN or inf): a "
            "comparison proves nothing (weights left uninitialised, an overflow)"
        )
    assert "passed" not in set(statuses(report).values()) - {statuses(report)["shape checks"]}
    assert report.verdict == "inconclusive"


@pytest.mark.parametrize("size", SIZES)
def test_causality_still_fails_a_leak_with_finite_weights(size):
    got = result(check(build(Attention, size, causal=True, bug="leak"), data(size)), "causality")
    assert got.status == "failed"
    assert "moved the output of token 0 by " in got.message


# -- a property the module's structure does not promise ----------------------------------------
class ScoreTable(Attention):
    """A relative-bias table of one length added to the scores (not per head)."""

    def __init__(self, heads, d_k, seq, **kwargs):
        super().__init__(heads, d_k, style="matmul", **kwargs)
        self.register_buffer("bias", torch.randn(seq, seq))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.heads(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + self.bias
        y = scores.softmax(dim=-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("size", ["distinct", "realistic"])
@pytest.mark.parametrize("style", STYLES)
def test_a_position_term_the_probe_does_not_see_is_inconclusive(size, style):
    seq = SIZES[size][2]
    report = positions_report(size, style)
    why = reason(report, "token-permutation equivariance")
    assert why.startswith("add at tests/test_probe_outcomes.py:")
    assert why.endswith(
        f"adds a term made from the module's own parameters or buffers ([1, {seq}, "
        f"{SIZES[size][1] * SIZES[size][3]}]), laid along the {seq} tokens: a position term (a "
        "learned position table, a relative bias cut to the length) the permutation does not "
        "move, so the module is not permutation-equivariant by design"
    )
    table = check(build(ScoreTable, size, seq), data(size))
    assert f"([{seq}, {seq}]), laid along the {seq} tokens" in reason(
        table, "token-permutation equivariance"
    )


@pytest.mark.parametrize("size", ["distinct", "realistic"])
@pytest.mark.parametrize("style", STYLES)
def test_token_permutation_still_fails_tokens_mixed_without_a_position_term(size, style):
    got = result(
        check(build(Attention, size, style=style, bug="cumsum"), data(size)),
        "token-permutation equivariance",
    )
    assert got.status == "failed"
    assert "hint: with no mask and no positions, attention treats tokens as a set" in got.message


class PerHeadGate(nn.Module):
    """nanochat's value residual: v += gate * ve, one gate per head from its own Linear,
    ve the input's features cut into heads (repro-real-repositories/per_head_gate.py)."""

    def __init__(self, heads, d_k, merge_bug=False):
        super().__init__()
        d = heads * d_k
        self.h, self.hd, self.merge_bug = heads, d_k, merge_bug
        self.c_q, self.c_k, self.c_v, self.c_proj = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.ve_gate = nn.Linear(d, heads, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.h, self.hd)
        k = self.c_k(x).view(B, T, self.h, self.hd)
        v = self.c_v(x).view(B, T, self.h, self.hd)
        gate = 3 * torch.sigmoid(self.ve_gate(x))  # [B, T, heads]
        v = v + gate.unsqueeze(-1) * x.view(B, T, self.h, self.hd)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class PositionalQuery(nn.Module):
    """Conditional-DETR's query: per head, the content query concatenated with a
    positional query from its own projection (q_pos_sine_proj)."""

    def __init__(self, heads, d_k):
        super().__init__()
        d = heads * d_k
        self.h = heads
        self.q, self.q_pos, self.k, self.k_pos, self.v, self.o = (nn.Linear(d, d) for _ in range(6))

    def forward(self, x, pos):
        B, T, C = x.shape

        def split(t):
            return t.view(B, T, self.h, C // self.h)

        q = torch.cat([split(self.q(x)), split(self.q_pos(pos))], dim=-1).transpose(1, 2)
        k = torch.cat([split(self.k(x)), split(self.k_pos(pos))], dim=-1).transpose(1, 2)
        v = split(self.v(x)).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("size", SIZES)
def test_per_head_terms_the_permutation_does_not_reach_are_inconclusive(size):
    why = reason(check(build(PerHeadGate, size), data(size)), "head-permutation invariance")
    assert why.startswith("add at tests/test_probe_outcomes.py:")
    assert why.endswith(
        "the heads meet a term of their own that the permutation does not reach (made by "
        "another projection, a table or the input, not by the projections whose rows are "
        "permuted): a per-head gate, value residual or positional query"
    )
    x = data(size)
    detr = check(build(PositionalQuery, size), x, torch.randn_like(x))
    assert reason(detr, "head-permutation invariance").startswith(
        "cat at tests/test_probe_outcomes.py:"
    )


@pytest.mark.parametrize("size", SIZES)
def test_head_permutation_still_fails_heads_merged_without_the_transpose(size):
    got = result(
        check(build(Attention, size, bug="merge"), data(size)), "head-permutation invariance"
    )
    assert got.status == "failed"
    assert "hint: heads are not kept apart between the split and the merge" in got.message


class SharedLayer(nn.Module):
    """ALBERT: one layer's weights used at every depth (called twice)."""

    def __init__(self, heads, d_k, bug=None):
        super().__init__()
        self.layer = Attention(heads, d_k, bug=bug)

    def forward(self, x):
        for _ in range(2):
            x = x + self.layer(x)
        return x


@pytest.mark.parametrize("size", SIZES)
def test_a_layer_shared_across_depth_keeps_one_head_order(size):
    got = result(check(build(SharedLayer, size), data(size)), "head-permutation invariance")
    assert got.status == "passed", got.message
    bug = result(
        check(build(SharedLayer, size, "merge"), data(size)), "head-permutation invariance"
    )
    assert bug.status == "failed"


class NormedHeads(nn.Module):
    """Persimmon: a packed projection, then LayerNorms over each head's d_k for Q and K."""

    def __init__(self, heads, d_k, merge_bug=False):
        super().__init__()
        d = heads * d_k
        self.h, self.merge_bug = heads, merge_bug
        self.query_key_value = nn.Linear(d, 3 * d)
        self.q_norm, self.k_norm = nn.LayerNorm(d_k), nn.LayerNorm(d_k)
        self.dense = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        fused = self.query_key_value(x).view(B, T, self.h, 3, C // self.h)
        q, k, v = fused.unbind(dim=3)
        q, k = self.q_norm(q), self.k_norm(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        y = y.reshape(B, T, C) if self.merge_bug else y.transpose(1, 2).reshape(B, T, C)
        return self.dense(y)


@pytest.mark.parametrize("size", SIZES)
def test_a_norm_over_each_heads_d_k_is_not_permuted_as_a_head(size):
    got = result(check(build(NormedHeads, size), data(size)), "head-permutation invariance")
    assert got.status == "passed", got.message
    bug = result(check(build(NormedHeads, size, True), data(size)), "head-permutation invariance")
    assert bug.status == "failed"


# -- the module's own cache or state ------------------------------------------------------------
class Cache:
    """A decoder's own cache object (x-transformers' LayerIntermediates)."""

    def __init__(self, k, v):
        self.k, self.v = k, v

    @property
    def cache_length(self):
        return self.k.shape[2]


class OwnCache(nn.Module):
    """A decoder whose `cache=` is its own object (repro-real-repositories/cache_object_param.py);
    `bug="mix_batch"`: examples see the batch mean."""

    def __init__(self, vocab=50, d=32, h=4, bug=None):
        super().__init__()
        self.emb, self.qkv, self.out, self.h = (
            nn.Embedding(vocab, d),
            nn.Linear(d, 3 * d),
            nn.Linear(d, vocab),
            h,
        )
        self.bug = bug

    def forward(self, x, cache=None, return_cache=False):
        h = self.emb(x)
        if self.bug == "mix_batch":
            h = h + h.mean(dim=0, keepdim=True)
        B, T, C = h.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(h).split(C, 2)
        )
        if cache is not None:
            _ = cache.cache_length
            k, v = torch.cat([cache.k, k], 2), torch.cat([cache.v, v], 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        logits = self.out(y.transpose(1, 2).reshape(B, T, C))
        return (logits, Cache(k, v)) if return_cache else logits


def ids(batch=2, seq=5, vocab=50):
    torch.manual_seed(1)
    return torch.randint(1, vocab, (batch, seq))


def test_a_cache_argument_of_the_modules_own_is_inconclusive():
    torch.manual_seed(0)
    report = check(OwnCache(), ids())
    why = reason(report, "decode consistency")
    assert why == (
        "the module rejects a step of the decoding: the prefill with its cache= dict fails: "
        "'dict' object has no attribute 'cache_length'"
    )
    assert report.passed, report.render(width=200)


def test_decode_consistency_still_fails_positions_restarting_at_zero():
    from cached_attention import B, CachedAttention, D, S

    torch.manual_seed(0)
    got = result(check(CachedAttention("rope_restart"), torch.randn(B, S, D)), "decode consistency")
    assert got.status == "failed"
    assert "likely cause: positions restart at 0 on this step" in got.message


def test_the_modules_own_cache_passed_in_is_inconclusive():
    torch.manual_seed(0)
    model = OwnCache()
    x = ids()
    _, cache = model(x, return_cache=True)
    report = check(model, ids(), cache=cache)
    got = result(report, "probes")
    assert got.status == "inconclusive"
    assert got.message == (
        "the inputs hold the module's own cache or state (cache (Cache)): the probes cannot "
        "cut, change or copy it with the examples and tokens, and each run changes it; check "
        "the module without it"
    )
    assert report.passed and report.verdict == "inconclusive"


def test_a_transformers_model_with_its_cache_filled_is_inconclusive():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = transformers.MistralForCausalLM(config).eval()
    filled = model(torch.randint(0, 50, (2, 4)), use_cache=True).past_key_values
    report = check(model, torch.randint(0, 50, (2, 1)), cache=filled)
    got = result(report, "probes")
    assert got.status == "inconclusive"
    assert got.message.startswith(
        f"the inputs hold the module's own cache or state (cache ({type(filled).__name__})): "
    )
    assert report.passed


def test_without_its_cache_the_same_model_still_fails_batch_mixing():
    torch.manual_seed(0)
    got = result(check(OwnCache(bug="mix_batch"), ids()), "batch independence")
    assert got.status == "failed"


class KeepsState(Attention):
    """A module that counts its calls in a buffer and scales by the count."""

    def __init__(self, heads, d_k, **kwargs):
        super().__init__(heads, d_k, causal=True, **kwargs)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.attention(x) * self.calls


@pytest.mark.parametrize("size", SIZES)
def test_a_module_that_keeps_state_between_calls_is_inconclusive(size):
    report = check(build(KeepsState, size), data(size))
    why = reason(report, "causality")
    assert why.startswith(
        "the forward is not deterministic: two runs of the same inputs with the same RNG state are "
    )
    assert why.endswith(
        "the module keeps state between calls (a cache or a counter it updates), so no "
        "comparison of two runs proves anything"
    )
    assert report.passed


class NoCacheReturned(Attention):
    """RecurrentGemma's shape: takes `cache` and `use_cache`, keeps its state inside and
    returns no cache."""

    def __init__(self, heads, d_k, **kwargs):
        super().__init__(heads, d_k, causal=True, **kwargs)

    def forward(self, x, cache=None, use_cache=None):
        return {"last_hidden_state": self.attention(x)}


def test_a_model_that_returns_no_cache_is_inconclusive_for_decoding():
    report = check(build(NoCacheReturned, "distinct"), data("distinct"))
    assert reason(report, "decode consistency") == (
        "the module rejects a step of the decoding: the prefill with its own cache (cache=) "
        "fails: the module returned no cache with use_cache=True"
    )
    assert report.passed


class EncoderDecoder(nn.Module):
    """An encoder over `src` (a padding mask, no causal mask) and a causal decoder over
    `tgt` reading it; the outputs keep the encoder's tokens first (`decoder_first`: the
    decoder's). `leak`: the decoder's causal mask one key too wide."""

    def __init__(self, heads, d_k, decoder_first=False, leak=False):
        super().__init__()
        self.encoder = Attention(heads, d_k, style="matmul")
        self.decoder = Attention(heads, d_k, causal=True, bug="leak" if leak else None)
        self.decoder_first = decoder_first

    def forward(self, src, src_mask, tgt):
        B, S, C = src.shape
        q, k, v = self.encoder.heads(src)
        keep = src_mask[:, None, None, :].bool()
        memory = attend(q, k, v, "matmul", keep=keep).transpose(1, 2).reshape(B, S, C)
        out = self.decoder(tgt + memory[:, :1])  # the first source token, real in every example
        return (out, memory) if self.decoder_first else (memory, out)


def enc_dec_inputs(size):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(0)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[0, -1] = 0
    return torch.randn(b, s, h * dk), mask, torch.randn(b, s + 1, h * dk)


@pytest.mark.parametrize("size", ["distinct", "realistic"])
def test_a_causal_mask_over_other_queries_is_not_the_tested_tokens_causality(size):
    report = check(build(EncoderDecoder, size), *enc_dec_inputs(size))
    got = result(report, "causality")
    assert got.status == "skipped" and not got.applicable, report.render(width=200)
    assert got.message == (
        "the attention over src is not causal: its mask is not, and the causal one (a "
        "triangular mask in scaled_dot_product_attention) is over other queries"
    )
    assert report.passed


@pytest.mark.parametrize("size", ["distinct", "realistic"])
def test_causality_still_fails_a_decoders_leak_where_its_tokens_are_tested(size):
    model = build(EncoderDecoder, size, decoder_first=True, leak=True)
    got = result(check(model, *enc_dec_inputs(size)), "causality")
    assert got.status == "failed"


# -- randomness ---------------------------------------------------------------------------------
class DropoutInClosure(nn.Module):
    """minGPT's Block: the MLP is a lambda over the original module's Dropout, which the
    probes' eval() on their copy does not reach (repro-real-repositories/dropout_in_closure.py).
    `leak`: a causal mask one key too wide."""

    def __init__(self, heads, d_k, p=0.1, leak=False):
        super().__init__()
        d = heads * d_k
        self.qkv, self.proj, self.h, self.leak = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, leak
        self.mlp = nn.ModuleDict(
            dict(fc=nn.Linear(d, 4 * d), out=nn.Linear(4 * d, d), dropout=nn.Dropout(p))
        )
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.out(F.gelu(m.fc(x))))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)
        )
        keep = torch.ones(T, T, dtype=torch.bool).tril(1 if self.leak else 0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlpf(x)


@pytest.mark.parametrize("size", SIZES)
def test_dropout_that_eval_does_not_reach_is_off_in_the_probes(size):
    model = build(DropoutInClosure, size)  # in training mode, as every module starts
    report = check(model, data(size))
    assert report.failed == [], report.render(width=200)
    for name in ("batch independence", "causality", "head-permutation invariance"):
        assert result(report, name).status in ("passed", "inconclusive"), name
    assert result(report, "causality").status == "passed"
    assert model.training and model.mlp.dropout.training  # the caller's module as it was


def test_causality_still_fails_a_leak_beside_dropout_in_a_closure():
    got = result(
        check(build(DropoutInClosure, "distinct", leak=True), data("distinct")), "causality"
    )
    assert got.status == "failed"
    assert "moved the output of token 0 by " in got.message


class Noisy(Attention):
    """Noise from the global RNG on every forward."""

    def __init__(self, heads, d_k, **kwargs):
        super().__init__(heads, d_k, causal=True, **kwargs)

    def forward(self, x):
        return self.attention(x + 0.1 * torch.randn_like(x))


@pytest.mark.parametrize("size", ["distinct", "realistic"])
def test_a_forward_that_draws_from_the_global_rng_is_inconclusive_where_draws_move(size):
    report = check(build(Noisy, size), data(size))
    # Same shapes, same RNG state: the draws land alike and the probe compares like with like.
    assert result(report, "batch independence").status == "passed"
    assert result(report, "head-permutation invariance").status == "passed"
    # Copies of one example in one batch draw different noise: no counterexample.
    why = reason(report, "causality")
    assert why.startswith("the forward draws from the global RNG (under another RNG state its ")
    assert why.endswith(
        "the probe's runs start from one RNG state, but its edit moves which rows or positions "
        "the draws land on, so this difference is no counterexample"
    )
    assert report.passed


class RandomMasking(nn.Module):
    """ViT-MAE: a random half of the patches kept, chosen from the global RNG on every
    forward; `mix_batch`: examples see the batch mean."""

    def __init__(self, heads, d_k, mix_batch=False):
        super().__init__()
        self.inner = Attention(heads, d_k)
        self.mix_batch = mix_batch

    def forward(self, x):
        B, L, D = x.shape
        noise = torch.rand(B, L)
        keep = noise.argsort(dim=1)[:, : max(1, L // 2)]
        x = torch.gather(x, 1, keep[..., None].expand(-1, -1, D))
        if self.mix_batch:
            x = x + x.mean(dim=0, keepdim=True)
        return self.inner(x)


@pytest.mark.parametrize("size", ["distinct", "realistic"])
def test_random_masking_compares_like_with_like(size):
    report = check(build(RandomMasking, size), data(size))
    assert result(report, "batch independence").status == "passed", report.render(width=200)
    assert result(report, "head-permutation invariance").status == "passed"
    assert report.passed


def test_a_random_forward_that_also_mixes_examples_is_inconclusive_not_passed():
    # A failure of a module that draws from the RNG is no counterexample (the draws may
    # have moved with the edit): it is inconclusive, never passed. The same mixing without
    # the randomness fails (test_sub_batch_consistency_still_fails_examples_that_see_the_batch,
    # test_without_its_cache_the_same_model_still_fails_batch_mixing).
    model = build(RandomMasking, "distinct", True)
    got = result(check(model, data("distinct")), "batch independence")
    assert got.status == "inconclusive"
    assert got.message.startswith("the forward draws from the global RNG")
    assert "\n  the probe failed: changing example 1 of 2 (x) moved" in got.message


# -- a dtype the module does not take ----------------------------------------------------------
class Float32Scratch(Attention):
    """Keeps a float32 scratch tensor as a plain attribute (`.to(float64)` does not cast
    it) and writes the tokens into it with index_copy_, which needs equal dtypes, on its
    shorter-than-full path only."""

    def __init__(self, heads, d_k, seq, leak=False, **kwargs):
        super().__init__(heads, d_k, causal=True, bug="leak" if leak else None, **kwargs)
        self.seq = seq
        self.scratch = torch.zeros(64, seq, heads * d_k)

    def forward(self, x):
        B, T, C = x.shape
        if self.seq > T:
            self.scratch[:B, :T].index_copy_(1, torch.arange(T), x)
        return self.attention(x)


def test_a_dtype_the_module_does_not_take_is_confirmed_as_given():
    seq = SIZES["distinct"][2]
    report = check(build(Float32Scratch, "distinct", seq), data("distinct"))
    got = result(report, "length change")
    assert got.status == "passed", report.render(width=200)
    assert got.message == (
        "running the first 3 of 5 tokens alone left their outputs unchanged (deviation "
        f"{got.deviation:.1e}) (in float32, as given; the float64 copy is rejected: the module "
        "rejects the probe's input (seq 3 instead of 5): index_copy_ failed in torch: "
        "index_copy_(): self and source expected to have the same dtype, but got (self) Float "
        "and (source) Double)"
    )


def test_as_given_the_same_probe_still_fails_a_real_bug():
    seq = SIZES["distinct"][2]
    report = check(build(Float32Scratch, "distinct", seq, leak=True), data("distinct"))
    assert result(report, "causality").status == "failed"


# -- the probe's own crash ----------------------------------------------------------------------
def test_a_crash_of_a_probes_own_code_is_inconclusive_and_never_propagates(monkeypatch):
    from shapeguard._probes import heads

    def broken(watch, generator):
        raise IndexError("index out of range in self")

    monkeypatch.setattr(heads, "plan_heads", broken)
    report = check(build(Attention, "distinct", bug="merge"), data("distinct"))
    got = result(report, "head-permutation invariance")
    assert got.status == "inconclusive"
    assert got.message.startswith(
        "shapeguard's probe code failed: IndexError: index out of range in self (at "
        "shapeguard/_probes/"
    )
    assert got.message.endswith(
        "this says nothing about the module (it is shapeguard's fault: please report it)"
    )
    # The other probes still ran, and still find the bug.
    assert result(report, "shape checks").status == "failed"


def test_a_crash_while_watching_the_forward_leaves_the_shape_checks_alone(monkeypatch):
    from shapeguard._probes import masks

    def broken(*args):
        raise IndexError("index -9 is out of bounds for dimension 0 with size 7")

    monkeypatch.setattr(masks, "causal_pattern", broken)
    torch.manual_seed(0)
    model = Attention(3, 4, style="matmul", causal=True)
    report = check(model, torch.randn(2, 5, 12))
    assert result(report, "shape checks").status == "passed"
    got = result(report, "probes")
    assert got.status == "inconclusive"
    assert got.message.startswith(
        "shapeguard's own probe code failed while watching the forward (IndexError: index -9 "
        "is out of bounds for dimension 0 with size 7 (at shapeguard/_probes/"
    )


class Latents(nn.Module):
    """Perceiver: 16 latent queries over 7 keys, a mask aligned bottom-right (the first
    queries see no key) and a padding mask."""

    def __init__(self, d=16, n=16):
        super().__init__()
        self.n = n
        self.latents = nn.Parameter(torch.randn(n, d))
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, mask):
        B, T, C = x.shape
        q = self.q(self.latents).expand(B, -1, -1).reshape(B, self.n, 2, C // 2).transpose(1, 2)
        k = self.k(x).view(B, T, 2, C // 2).transpose(1, 2)
        v = self.v(x).view(B, T, 2, C // 2).transpose(1, 2)
        scores = q @ k.transpose(-1, -2)
        keep = torch.ones(self.n, T, dtype=torch.bool).tril(T - self.n) | (
            mask[:, None, None, :] == 0
        )
        scores = scores.masked_fill(~keep, -1e9).masked_fill(mask[:, None, None, :] == 0, -1e9)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, self.n, C)


def test_more_queries_than_keys_do_not_crash_the_watch():
    torch.manual_seed(0)
    mask = torch.ones(2, 7, dtype=torch.long)
    report = check(Latents(), torch.randn(2, 7, 16), mask)
    assert result(report, "shape checks").status == "passed", report.render(width=200)
    assert "probes" not in statuses(report)


def test_a_permutation_that_does_not_fit_a_parameter_is_inconclusive():
    from shapeguard._probes.heads import _misfit

    model = nn.Linear(4, 6)
    assert _misfit(model, {"weight": [(0, torch.arange(6))]}) == ""
    assert _misfit(model, {"weight": [(1, torch.arange(6))]}) == (
        "the heads read for weight [6, 4] do not fit its axis 1: the trace's head layout is "
        "not that parameter's"
    )


# -- the output does not depend on the attention -------------------------------------------------
class CrossAttentionBlock(nn.Module):
    """A diffusion U-Net's block: the output projection starts at zero (zero_module,
    adaLN-Zero), and the padding mask is tiled heads-first (`repeat`) against a
    batch-first (b h) fold: each example gets another's padding
    (repro-domains/zero_init_out_check_passes.py)."""

    def __init__(self, heads, d_k, zero_init=True):
        super().__init__()
        d = heads * d_k
        self.h, self.d_k = heads, d_k
        self.to_q, self.to_k, self.to_v = (nn.Linear(d, d) for _ in range(3))
        self.proj_out = nn.Linear(d, d)
        if zero_init:
            nn.init.zeros_(self.proj_out.weight)
            nn.init.zeros_(self.proj_out.bias)

    def forward(self, x, context, mask):  # mask [B, S]: True = real token
        B, L, _ = x.shape
        S = context.shape[1]

        def fold(t, n):
            return t.view(B, n, self.h, self.d_k).transpose(1, 2).reshape(B * self.h, n, self.d_k)

        q, k, v = fold(self.to_q(x), L), fold(self.to_k(context), S), fold(self.to_v(context), S)
        sim = q @ k.transpose(1, 2) / self.d_k**0.5
        sim = sim.masked_fill(~mask.repeat(self.h, 1)[:, None, :], -1e9)  # BUG: repeat_interleave
        out = (sim.softmax(-1) @ v).view(B, self.h, L, self.d_k).transpose(1, 2).reshape(B, L, -1)
        return x + self.proj_out(out)


def cross_inputs(size):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(0)
    mask = torch.ones(b, s + 1, dtype=torch.bool)
    mask[1, 2:] = False
    return torch.randn(b, s, h * dk), torch.randn(b, s + 1, h * dk), mask


@pytest.mark.parametrize("size", SIZES)
def test_an_output_that_does_not_depend_on_the_attention_is_probed_inside(size):
    # The output is deaf to the attention: the probes measure the context before the zero
    # projection instead, where the tiled mask shows (tests/test_probe_zero_init.py).
    report = check(build(CrossAttentionBlock, size), *cross_inputs(size))
    sub = result(report, "sub-batch consistency")
    assert sub.status == "failed", report.render(width=200)
    first = sub.message.splitlines()[0]
    assert "; measured on the input of proj_out (Linear) at tests/test_probe_outcomes.py:" in first
    assert first.endswith(
        "because the output does not depend on the attention (all-zero weights: "
        "proj_out.weight, as zero_module and adaLN-Zero start)"
    )
    assert not report.passed and report.verdict == "failed"


class GatedInline(nn.Module):
    """The attention inline and its result scaled by a gate at zero, no module after it:
    nothing the probes can run measures what the attention does."""

    def __init__(self, heads, d_k):
        super().__init__()
        d = heads * d_k
        self.h, self.d_k = heads, d_k
        self.to_qkv = nn.Linear(d, 3 * d)
        self.gate = nn.Parameter(torch.zeros(()))

    def forward(self, x):
        B, L, _ = x.shape
        q, k, v = self.to_qkv(x).view(B, L, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
        out = (q @ k.transpose(-2, -1) / self.d_k**0.5).softmax(-1) @ v
        return x + self.gate * out.transpose(1, 2).reshape(B, L, -1)


@pytest.mark.parametrize("size", SIZES)
def test_an_output_deaf_to_an_inline_attention_passes_nothing(size):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(0)
    report = check(build(GatedInline, size), torch.randn(b, s, h * dk))
    assert "passed" not in [r.status for r in report.probes], report.render(width=200)
    why = reason(report, "batch independence")
    assert why.startswith(
        "the output does not depend on the attention: noise added to the output of 1 attention "
        "op (tests/test_probe_outcomes.py:"
    ), why
    assert (
        "left it unchanged (deviation 0.0e+00), so no probe of the output can see what the "
        "attention does (all-zero weights: gate, as zero_module and adaLN-Zero start); no "
        "module's input or output moves with the attention either"
    ) in why, why
    assert report.passed and report.verdict == "inconclusive"


@pytest.mark.parametrize("size", SIZES)
def test_the_same_block_with_its_projection_initialised_fails_sub_batch_consistency(size):
    report = check(build(CrossAttentionBlock, size, zero_init=False), *cross_inputs(size))
    assert result(report, "sub-batch consistency").status == "failed", report.render(width=200)


# -- a made-up input is not a mask; a pad id is not a token -----------------------------------------
class TinyLM(nn.Module):
    """nanoGPT's forward(idx, targets=None): targets only feed the loss
    (repro-real-repositories/targets_as_mask.py)."""

    def __init__(self, vocab=50, d=32, heads=4):
        super().__init__()
        self.emb, self.qkv, self.head, self.h = (
            nn.Embedding(vocab, d),
            nn.Linear(d, 3 * d),
            nn.Linear(d, vocab),
            heads,
        )

    def forward(self, idx, targets=None):
        x = self.emb(idx)
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        logits = self.head(y.transpose(1, 2).reshape(B, T, C))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_an_all_zeros_input_no_op_applies_is_not_a_padding_mask():
    torch.manual_seed(0)
    report = check(TinyLM(), ids(), torch.zeros(2, 5, dtype=torch.long))
    got = result(report, "key-padding invariance")
    assert got.status == "skipped" and not got.applicable, report.render(width=200)
    assert report.passed


class SkipsAllOnes(nn.Module):
    """An HF-style causal LM that skips an all-ones attention_mask (SDPA's is_causal path);
    `bug`: the padding applied to the queries instead of the keys."""

    def __init__(self, vocab=50, d=32, heads=4, bug=False):
        super().__init__()
        self.emb, self.qkv, self.out, self.h, self.bug = (
            nn.Embedding(vocab, d),
            nn.Linear(d, 3 * d),
            nn.Linear(d, d),
            heads,
            bug,
        )

    def forward(self, input_ids, attention_mask):
        x = self.emb(input_ids)
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)
        )
        if bool(attention_mask.all()):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            pad = attention_mask.bool()
            pad = pad[:, None, :, None] if self.bug else pad[:, None, None, :]
            keep = torch.ones(T, T, dtype=torch.bool).tril() & pad
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


def test_an_all_ones_mask_no_op_applied_is_read_from_a_retrace():
    torch.manual_seed(0)
    report = check(SkipsAllOnes(), ids(), torch.ones(2, 5, dtype=torch.long))
    assert result(report, "key-padding invariance").status == "passed", report.render(width=200)
    bug = check(SkipsAllOnes(bug=True), ids(), torch.ones(2, 5, dtype=torch.long))
    assert result(bug, "key-padding invariance").status == "failed", bug.render(width=200)


def test_new_token_ids_never_take_the_pad_id():
    from shapeguard._probes.edits import redrawn
    from shapeguard._probes.layout_records import Leaf

    leaf = Leaf((0, 0), "ids", "ids", ids_range=(0, 9), avoid=frozenset({0, 3}))
    old = torch.arange(10).repeat(50)
    new = redrawn(
        leaf, old, torch.ones_like(old, dtype=torch.bool), torch.Generator().manual_seed(0)
    )
    assert not bool(torch.isin(new, torch.tensor([0, 3])).any())
    assert not bool((new == old).any())


def test_the_pad_ids_come_from_the_config_and_the_embeddings():
    from shapeguard._probes.layout_records import Layout, Leaf
    from shapeguard._probes.prepare import avoid_pad_ids

    model = nn.Module()
    model.config = type("Config", (), {"pad_token_id": 1})()
    model.emb = nn.Embedding(10, 4, padding_idx=-1)
    layout = Layout(2, [5], {(0, 0): Leaf((0, 0), "ids", "ids")})
    avoid_pad_ids(model, layout)
    assert layout.leaves[(0, 0)].avoid == frozenset({1, 9})


def test_an_input_whose_batch_axis_is_unknown_is_not_resized():
    from shapeguard._probes.layout import _unbatched
    from shapeguard._probes.layout_records import Layout, Leaf

    layout = Layout(3, [5, 4000], {})
    layout.leaves[(1, "input_values")] = Leaf(
        (1, "input_values"), "input_values", "data", seq={1: 1}
    )
    layout.leaves[(1, "decoder_input_ids")] = Leaf(
        (1, "decoder_input_ids"), "decoder_input_ids", "ids", batch=0, seq={1: 0}
    )
    found = [
        ((1, "input_values"), torch.zeros(3, 4000)),
        ((1, "decoder_input_ids"), torch.zeros(3, 5, dtype=torch.long)),
    ]
    assert _unbatched(layout, found) == (
        "input_values [3, 4000]: its axis 0 is as long as the batch (3), but the trace does "
        "not show it is the batch, so a probe that resizes the batch cannot keep it "
        "consistent with the other inputs"
    )
    layout.leaves[(1, "input_values")].batch = 0
    assert _unbatched(layout, found) == ""


# -- reporting -----------------------------------------------------------------------------------
def test_the_report_shows_inconclusive_apart_and_fails_nothing():
    report = check(build(PerHeadGate, "distinct"), data("distinct"))
    text = report.render(width=200)
    row = next(line for line in text.splitlines() if line.startswith("│ head-permutation"))
    assert "│ inconclusive │" in row
    assert text.splitlines()[-1] == "11 checks in float64: 6 passed, 1 inconclusive, 4 n/a; passed"
    assert report.passed and report.verdict == "passed"
    assert [r.name for r in report.inconclusive] == ["head-permutation invariance"]
    data_ = report.to_dict()
    entry = next(r for r in data_["results"] if r["name"] == "head-permutation invariance")
    assert entry["status"] == "inconclusive" and entry["passed"] is True
    assert entry["reason"] == entry["message"].splitlines()[0]
    assert entry["hint"] is None
    assert data_["counts"] == {"passed": 6, "failed": 0, "inconclusive": 1, "skipped": 4}


def test_the_command_exits_0_on_inconclusive_and_says_how_many(tmp_path):
    import json
    import textwrap

    from click.testing import CliRunner

    from shapeguard._cli.commands import cli

    path = tmp_path / "gate.py"
    path.write_text(
        textwrap.dedent(
            """
            import torch
            import torch.nn.functional as F
            from torch import nn


            class Attn(nn.Module):
                def __init__(self, d=64, h=4):
                    super().__init__()
                    self.h, self.hd = h, d // h
                    self.c_q, self.c_k, self.c_v, self.c_proj = (nn.Linear(d, d) for _ in range(4))
                    self.ve_gate = nn.Linear(d, h)

                def forward(self, x):
                    B, T, C = x.shape
                    q = self.c_q(x).view(B, T, self.h, self.hd)
                    k = self.c_k(x).view(B, T, self.h, self.hd)
                    v = self.c_v(x).view(B, T, self.h, self.hd)
                    gate = torch.sigmoid(self.ve_gate(x))
                    v = v + gate.unsqueeze(-1) * x.view(B, T, self.h, self.hd)
                    y = F.scaled_dot_product_attention(
                        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
                    )
                    return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
            """
        )
    )
    done = CliRunner().invoke(cli, ["check", str(path)])
    assert done.exit_code == 0, done.stdout + done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("│")]
    row = next(r for r in rows if "head-permutation invariance" in r)
    assert "│ inconclusive │ add at " in row
    assert done.stdout.splitlines()[-1] == (
        "11 checks: 6 passed, 1 inconclusive, 4 n/a; passed (1 inconclusive: see the reasons above)"
    )
    out = json.loads(CliRunner().invoke(cli, ["check", str(path), "--json", "-"]).stdout)
    assert out["check"]["passed"] is True and out["check"]["inconclusive"] == 1
    row = next(r for r in out["check"]["results"] if r["name"] == "head-permutation invariance")
    assert row["status"] == "inconclusive" and row["detail"].startswith("add at ")
    probe = next(
        r for r in out["check"]["probes"]["results"] if r["name"] == "head-permutation invariance"
    )
    assert probe["status"] == "inconclusive" and probe["reason"] == row["detail"]
    assert out["check"]["probes"]["verdict"] == "passed"


def test_run_check_takes_the_inputs_as_a_tuple_and_a_dict():
    report = run_probes(build(PerHeadGate, "distinct"), (data("distinct"),), {})
    assert result(report, "head-permutation invariance").status == "inconclusive"


def test_the_html_report_counts_inconclusive_apart_from_passed():
    import shapeguard
    from shapeguard.report.html import render_html

    trace = shapeguard.trace(nn.Linear(3, 4), torch.zeros(2, 3))
    passed = [("trace", "pass", "2 ops"), ("batch independence", "pass", "")]
    unsure = [*passed, ("head-permutation invariance", "inconclusive", "add at gate.py:19")]
    page = render_html(trace, checks=unsure)
    assert '<span class="verdict inconclusive">none failed, 1 inconclusive</span>' in page
    assert "all checks passed" not in page
    assert '<tr class="inconclusive"><td>head-permutation invariance</td>' in page
    assert "table.checks tr.inconclusive td {" in page
    assert '<span class="verdict ok">all checks passed</span>' in render_html(trace, checks=passed)
    failed = render_html(trace, checks=[*unsure, ("causality", "FAIL", "sees later tokens")])
    assert '<span class="verdict error">1 check failed</span>' in failed


# -- key padding: the padded positions reach the real tokens outside attention ---------------
class PaddedMixing(Attention):
    """Attention with an additive padding mask (`keep`: 1 a real token) on the key axis,
    beside a path that mixes positions outside attention (`mix`): "conv" (a convolution
    along the positions: ConvBERT, MobileBERT, the conformer package), "last_token" (the
    last position pooled: SigLIP's text tower), "recurrence" (a scan that ignores the mask:
    RecurrentGemma). `bug="unmasked"`: a second attention over the same keys without the
    mask (the mask does not reach every attention)."""

    def __init__(self, heads, d_k, *, style="sdpa", mix=None, bug=None):
        super().__init__(heads, d_k, style=style)
        d = heads * d_k
        self.mix, self.bug = mix, bug
        self.conv = nn.Conv1d(d, d, 3, padding=1)

    def masked(self, x, keep):
        q, k, v = self.heads(x)
        B, T, C = x.shape
        hide = keep[:, None, None, :] == 0
        bias = torch.zeros(hide.shape, dtype=x.dtype).masked_fill(hide, torch.finfo(x.dtype).min)
        if self.style == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            y = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, keep):
        y = self.masked(x, keep)
        if self.bug == "unmasked":
            y = y + self.masked(x, torch.ones_like(keep))
        if self.mix == "conv":
            y = y + self.conv(x.transpose(1, 2)).transpose(1, 2)
        elif self.mix == "last_token":
            return y, y[:, -1]
        elif self.mix == "recurrence":
            state, steps = torch.zeros_like(y[:, 0]), []
            for t in range(y.shape[1]):
                state = 0.5 * state + y[:, t]
                steps.append(state)
            y = y + torch.stack(steps, 1)
        return y


def padding_of(size, *, left=False):
    """A keep mask whose example 0 has a third of its tokens padded."""
    b, _, s, _ = SIZES[size]
    keep = torch.ones(b, s, dtype=torch.long)
    p = max(1, s // 3)
    if left:
        keep[0, :p] = 0
    else:
        keep[0, s - p :] = 0
    return keep


MIXING = {
    "conv": ("conv1d", "(a convolution along the positions)"),
    "last_token": ("__getitem__", "(an index or gather of positions)"),
    "recurrence": ("__getitem__", "(an index or gather of positions)"),
}


@functools.cache
def mixing_report(size, style, mix):
    """check of PaddedMixing with its padding (on the left for the recurrence): seeded, so the
    same report for each test that reads it (the convolution's is read twice), made once per
    process. Read only."""
    module = build(PaddedMixing, size, style=style, mix=mix)
    keep = padding_of(size, left=mix == "recurrence")
    return check(module, data(size), keep)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("mix", MIXING)
def test_padded_positions_mixed_outside_attention_are_inconclusive(size, style, mix):
    report = mixing_report(size, style, mix)
    why = reason(report, "key-padding invariance")
    op, what = MIXING[mix]
    assert why.startswith(f"the padded positions reach the real tokens through {op} at ")
    assert "test_probe_outcomes.py:" in why
    assert why.endswith(
        f"{what}, not through attention: the mask does not promise key-padding invariance here"
    )
    got = result(report, "key-padding invariance")
    assert "moved the real tokens' outputs by " in got.message and got.deviation > 1e-7
    if mix != "recurrence":  # a scan breaks token permutation, as a cumulative sum does
        assert report.passed, report.render(width=200)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("style", STYLES)
def test_key_padding_still_fails_an_attention_the_mask_does_not_reach_beside_a_conv(size, style):
    module = build(PaddedMixing, size, style=style, mix="conv", bug="unmasked")
    report = check(module, data(size), padding_of(size))
    failed = result(report, "key-padding invariance")
    assert failed.status == "failed", report.render(width=200)
    assert "moved the real tokens' outputs by " in failed.message
    op = "scaled_dot_product_attention" if style == "sdpa" else "softmax"
    assert failed.op.startswith(f"{op} at ") and "test_probe_outcomes.py:" in failed.op
    assert f"\n  first seen at {op} at " in failed.message
    assert (
        "hint: padded tokens still reach the real ones: the mask must reach every "
        "attention over these keys" in failed.message
    )


def test_an_output_whose_token_axis_the_trace_does_not_place_is_left_out():
    """LED and PEGASUS-X pad their input to a block multiple and cut it back: the encoder
    output's token axis is a new one, so its padded rows cannot be left out. Only the
    outputs the trace places are compared."""

    class BlockPadded(Attention):
        def forward(self, x, keep):
            B, T, C = x.shape
            hide = (keep == 0)[:, None, None, :]
            q, k, v = self.heads(x)
            bias = torch.zeros(hide.shape, dtype=x.dtype).masked_fill(hide, -1e9)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            y = self.out(y.transpose(1, 2).reshape(B, T, C))
            padded = torch.cat([y, y.new_zeros(B, 3, C)], dim=1)  # to a block multiple
            blocks = padded.view(B, -1, 4, C) * 2
            return y, blocks.reshape(B, -1, C)[:, :T]  # cut back: a new token axis

    report = check(build(BlockPadded, "distinct"), data("distinct"), padding_of("distinct"))
    got = result(report, "key-padding invariance")
    assert got.status == "passed", report.render(width=200)
    assert "; output[1] left out: an axis as long as the tokens the trace does not place" in (
        got.message
    )


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("style", STYLES)
def test_a_convolution_along_the_tokens_makes_permutation_not_apply(size, style):
    report = mixing_report(size, style, "conv")
    got = result(report, "token-permutation equivariance")
    assert got.status == "skipped" and not got.applicable, report.render(width=200)
    seq = SIZES[size][2]
    why = got.message.splitlines()[0]
    assert why.startswith("conv1d at ") and "test_probe_outcomes.py:" in why
    assert why.endswith(
        f"has a kernel of 3 along seq (axis 2 of its output, the {seq} tokens): it mixes "
        "neighbouring positions, so the output depends on the tokens' order by design and the "
        "module is not permutation-equivariant"
    )


@pytest.mark.parametrize("bug", [None, "unmasked"])
def test_key_padding_compares_a_batch_of_ones_only_example(bug):
    module = build(PaddedMixing, "distinct", bug=bug)
    report = check(module, data("distinct")[:1], padding_of("distinct")[:1])
    got = result(report, "key-padding invariance")
    assert got.status == ("failed" if bug else "passed"), report.render(width=200)
    assert got.message.startswith("changing x at the padded position 4 of example 0 ")
