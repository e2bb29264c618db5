"""Correct attention modules: zero findings in a trace, and every probe that applies passes.

Sizes are pairwise distinct within each module (batch 2, seq 5, memory 7, heads 3, d_k 11,
d_model 33 unless a test says otherwise), so no coincidence can hide a bug or make one up.
The transformers models are built from tiny config objects (no download) and are
skipped when transformers is not installed.
"""

import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard._probes.check import run_probes

B, S, SK, H, DK = 2, 5, 7, 3, 11
D = H * DK  # 33

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import seed_mha  # noqa: E402


def assert_correct(model, *args, expect: dict | None = None, **kwargs):
    """No finding in a trace, no failed probe; `expect` pins some probes' statuses."""
    torch.manual_seed(0)
    trace = shapeguard.trace(model, *args, **kwargs)
    assert trace.findings == [], [f.message for f in trace.findings]
    report = run_probes(model, args, kwargs)
    assert report.passed, report.render(width=160)
    statuses = {r.name: r.status for r in report.results}
    for name, status in (expect or {}).items():
        assert statuses[name] == status, report.render(width=160)
    return report


def test_seed_mha_with_a_causal_mask():
    args, kwargs = seed_mha.example_inputs(batch=B, seq=S, d_model=48)
    model = seed_mha.MultiHeadAttention(d_model=48, n_heads=H)
    assert_correct(
        model,
        *args,
        **kwargs,
        expect={
            "causality": "passed",
            "head-permutation invariance": "passed",
            "token-permutation equivariance": "skipped",
        },
    )


def test_seed_mha_without_a_mask():
    model = seed_mha.MultiHeadAttention(d_model=D, n_heads=H)
    assert_correct(
        model,
        torch.randn(B, S, D),
        expect={
            "causality": "skipped",
            "token-permutation equivariance": "passed",
            "head-permutation invariance": "passed",
            "batch independence": "passed",
        },
    )


class CausalSelfAttention(nn.Module):
    """nanoGPT's attention, with a block size longer than the sequence."""

    def __init__(self, n_embd=D, n_head=H, block_size=8):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("bias", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        B_, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B_, T, C)
        return self.c_proj(y)


def test_nanogpt_causal_attention():
    assert_correct(
        CausalSelfAttention(),
        torch.randn(B, S, D),
        expect={
            "causality": "passed",
            "length change": "passed",
            "head-permutation invariance": "passed",
        },
    )


class CrossAttention(nn.Module):
    """Queries from x [batch, seq_q, d_model], keys and values from memory [batch, seq_k, d]."""

    def __init__(self, d_model=D, n_heads=H):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, memory, memory_mask=None):
        batch, seq_q, _ = x.shape
        seq_k = memory.size(1)
        q = self.q_proj(x).view(batch, seq_q, self.n_heads, self.d_k).transpose(1, 2)
        k = self.k_proj(memory).view(batch, seq_k, self.n_heads, self.d_k).transpose(1, 2)
        v = self.v_proj(memory).view(batch, seq_k, self.n_heads, self.d_k).transpose(1, 2)
        keep = None if memory_mask is None else memory_mask[:, None, None, :]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        return self.out_proj(y.transpose(1, 2).reshape(batch, seq_q, self.d_model))


def test_cross_attention_with_different_lengths():
    keep = torch.arange(SK)[None, :] < torch.tensor([SK, 4])[:, None]
    report = assert_correct(
        CrossAttention(),
        torch.randn(B, S, D),
        torch.randn(B, SK, D),
        memory_mask=keep,
        expect={"key-padding invariance": "passed", "head-permutation invariance": "passed"},
    )
    assert (
        "memory_mask"
        in next(r for r in report.results if r.name == "key-padding invariance").message
    )


def test_cross_attention_without_a_mask_is_permutation_equivariant():
    assert_correct(
        CrossAttention(),
        torch.randn(B, S, D),
        torch.randn(B, SK, D),
        expect={
            "token-permutation equivariance": "passed",
        },
    )


def repeat_kv(x, n_rep):
    """[batch, kv_heads, seq, d_k] -> [batch, kv_heads * n_rep, seq, d_k], as Llama does."""
    batch, kv_heads, seq, d_k = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, d_k)
    return x.reshape(batch, kv_heads * n_rep, seq, d_k)


class GroupedQueryAttention(nn.Module):
    def __init__(self, dim=84, n_heads=12, n_kv_heads=3):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        output = F.scaled_dot_product_attention(xq, keys, values, is_causal=True)
        return self.wo(output.transpose(1, 2).reshape(bsz, seqlen, -1))


def test_grouped_query_attention_with_repeat_kv():
    assert_correct(
        GroupedQueryAttention(),
        torch.randn(B, S, 84),
        expect={
            "causality": "passed",
            "head-permutation invariance": "passed",
        },
    )


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class RotaryAttention(nn.Module):
    """Causal self-attention with rotary position embeddings on [batch, heads, seq, d_k]."""

    def __init__(self, d_model=36, n_heads=H):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.d_k, 2).float() / self.d_k))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(batch, seq, self.n_heads, self.d_k).transpose(1, 2) for t in (q, k, v))
        positions = torch.arange(seq, dtype=self.inv_freq.dtype)
        freqs = torch.outer(positions, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()  # [seq, d_k]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, seq, self.d_model))


def test_rotary_attention():
    assert_correct(
        RotaryAttention(),
        torch.randn(B, S, 36),
        expect={
            "causality": "passed",
            "length change": "passed",
            "head-permutation invariance": "passed",
        },
    )


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_multihead_attention(batch_first):
    x = torch.randn(B, S, D) if batch_first else torch.randn(S, B, D)
    pad = torch.arange(S)[None, :] >= torch.tensor([S, 3])[:, None]  # True = padding
    attn = nn.MultiheadAttention(D, H, batch_first=batch_first)
    assert_correct(
        attn,
        x,
        x,
        x,
        key_padding_mask=pad,
        expect={
            "key-padding invariance": "passed",
            "head-permutation invariance": "passed",
            "batch independence": "passed",
        },
    )
    assert_correct(attn, x, x, x, expect={"token-permutation equivariance": "passed"})


def test_multihead_attention_with_a_causal_mask():
    x = torch.randn(B, S, D)
    causal = nn.Transformer.generate_square_subsequent_mask(S)
    attn = nn.MultiheadAttention(D, H, batch_first=True)
    assert_correct(attn, x, x, x, attn_mask=causal, expect={"causality": "passed"})


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_transformer_encoder_layer(batch_first):
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=20, batch_first=batch_first)
    x = torch.randn(B, S, D) if batch_first else torch.randn(S, B, D)
    assert_correct(
        layer,
        x,
        expect={
            "batch independence": "passed",
            "head-permutation invariance": "passed",
        },
    )


# -- transformers ----------------------------------------------------------------------
def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed (test extra)")


def _causal_float_mask(batch, seq, dtype=torch.float32):
    mask = torch.full((seq, seq), torch.finfo(dtype).min).triu(1)
    return mask[None, None].expand(batch, 1, seq, seq)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_bert_attention(impl):
    tf = _transformers()
    from transformers.models.bert.modeling_bert import BertAttention

    config = tf.BertConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_hidden_layers=1,
        intermediate_size=20,
        vocab_size=50,
    )
    config._attn_implementation = impl
    attn = BertAttention(config).eval()
    x = torch.randn(B, S, D)
    keep = torch.arange(S)[None, :] < torch.tensor([S, 3])[:, None]
    mask = torch.zeros(B, 1, 1, S).masked_fill(
        ~keep[:, None, None, :], torch.finfo(torch.float32).min
    )
    assert_correct(
        attn,
        x,
        attention_mask=mask,
        expect={
            "key-padding invariance": "passed",
            "head-permutation invariance": "passed",
        },
    )


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_gpt2_attention(impl):
    tf = _transformers()
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    config = tf.GPT2Config(
        n_embd=D, n_head=H, n_layer=1, n_positions=16, vocab_size=50, bos_token_id=0, eos_token_id=0
    )
    config._attn_implementation = impl
    attn = GPT2Attention(config, layer_idx=0).eval()
    x = torch.randn(B, S, D)
    # The eager path takes the causal mask from the model; SDPA uses is_causal without one.
    kwargs = {"attention_mask": _causal_float_mask(B, S)} if impl == "eager" else {}
    assert_correct(
        attn,
        x,
        **kwargs,
        expect={
            "causality": "passed",
            "head-permutation invariance": "passed",
        },
    )


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_transformers_llama_attention(impl):
    tf = _transformers()
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = tf.LlamaConfig(
        hidden_size=36,
        num_attention_heads=H,
        num_key_value_heads=1,
        head_dim=12,
        intermediate_size=20,
        num_hidden_layers=1,
        vocab_size=50,
    )
    config._attn_implementation = impl
    attn = LlamaAttention(config, layer_idx=0).eval()
    x = torch.randn(B, S, 36)
    cos, sin = LlamaRotaryEmbedding(config)(x, torch.arange(S)[None].expand(B, S))
    kwargs = {"attention_mask": _causal_float_mask(B, S)} if impl == "eager" else {}
    assert_correct(
        attn,
        x,
        position_embeddings=(cos, sin),
        **kwargs,
        expect={
            "causality": "passed",
            "head-permutation invariance": "passed",
        },
    )
