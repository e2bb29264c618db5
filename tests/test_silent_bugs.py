"""Silent bugs: each one runs, returns the right shape, and computes the wrong thing.

For every bug class there is a buggy module and its fix: the buggy one is flagged
with the right kind and a hint that says how to fix it; the fixed one gives no
finding at all. Sizes are pairwise distinct (batch 2, heads 3, seq 5, d_k 11,
d_model 33) except where a bug needs two sizes to coincide to stay silent, and
then only those two coincide.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeError, ShapeWarning

# These tests provoke ShapeWarnings on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

B, H, S, DK = 2, 3, 5, 11
D = H * DK  # 33


def findings(model, *args, **kwargs):
    """Findings of one traced forward, in warn mode, with the ShapeWarnings swallowed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(model, *args, mode="warn", **kwargs)
    return trace.findings


def clean(model, *args, **kwargs):
    """A forward that must give no finding: any ShapeWarning fails the test (filterwarnings)."""
    trace = shapeguard.trace(model, *args, **kwargs)
    assert trace.findings == [], [f.message for f in trace.findings]


def only(found, kind):
    assert [f.kind for f in found] == [kind] * len(found) and found, [f.message for f in found]
    return found[0]


def padding(lengths, seq):
    """[batch, seq] with 1 for real tokens, 0 for right padding."""
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()


class Heads(nn.Module):
    """Multi-head self-attention with one head-split or head-merge bug, or none."""

    def __init__(self, bug=None, d_model=D, n_heads=H):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.bug = bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def split(self, t, batch, seq):
        if self.bug == "carve":
            return t.view(batch, self.n_heads, seq, self.d_k)
        return t.view(batch, seq, self.n_heads, self.d_k).transpose(1, 2)

    def forward(self, x):
        batch, seq, _ = x.shape
        Q = self.split(self.W_q(x), batch, seq)
        K = self.split(self.W_k(x), batch, seq)
        V = self.split(self.W_v(x), batch, seq)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        attn = F.softmax(scores, dim=-2 if self.bug == "softmax_axis" else -1)
        context = attn @ V
        if self.bug == "merge":
            context = context.reshape(batch, seq, self.d_model)
        else:
            context = context.transpose(1, 2).reshape(batch, seq, self.d_model)
        return self.out(context)


# -- axis provenance: views that mix axes ---------------------------------------------
def test_view_that_carves_heads_out_of_seq():
    found = findings(Heads("carve"), torch.randn(B, S, D))
    first = only(found, "view_mixes_axes")
    assert len(found) == 3  # Q, K and V
    assert first.message.splitlines()[0] == (
        "t.view(2, 3, 5, 11): carves heads out of the seq axis: "
        "regroups [seq=5, d_model=33] as [3, 5, 11]"
    )
    assert "  t      [batch=2, seq=5, d_model=33] float32" in first.message
    assert first.hint == (
        "split heads out of the feature axis, then move them: use "
        "t.view(batch, seq, heads, d_k).transpose(1, 2), i.e. view(2, 5, 3, 11).transpose(1, 2)"
    )
    assert first.location.endswith(
        f"test_silent_bugs.py:{_line_of('return t.view(batch, self.n_heads')}"
    )


def test_merge_of_heads_without_transpose():
    first = only(findings(Heads("merge"), torch.randn(B, S, D)), "view_mixes_axes")
    assert first.message.splitlines()[0] == (
        "context.reshape(2, 5, 33): merges heads back before moving them next to d_k: "
        "regroups [heads=3, seq_q=5, d_k=11] as [5, 33], so each output token holds pieces "
        "of other tokens"
    )
    assert first.hint == (
        "transpose first: context.transpose(1, 2).contiguous().view(batch, seq, heads * d_k), "
        "i.e. .transpose(1, 2).reshape(2, 5, 33)"
    )


def test_correct_head_split_and_merge_are_clean():
    clean(Heads(), torch.randn(B, S, D))


class SeqFirst(nn.Module):
    """Feeds a seq-first nn.MultiheadAttention from [batch, seq, d_model]."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.attn = nn.MultiheadAttention(D, H)

    def forward(self, x):
        batch, seq, d_model = x.shape
        x = x.transpose(0, 1) if self.fixed else x.reshape(seq, batch, d_model)
        out, _ = self.attn(x, x, x, need_weights=False)
        return out.transpose(0, 1)


def test_reshape_that_folds_batch_into_seq():
    first = only(findings(SeqFirst(fixed=False), torch.randn(B, S, D)), "view_mixes_axes")
    assert first.message.splitlines()[0] == (
        "x.reshape(5, 2, 33): folds batch into seq: regroups [batch=2, seq=5] as [5, 2], "
        "moving data across the batch axis"
    )
    assert first.hint == (
        "reshape reinterprets memory and does not swap axes; to exchange batch and seq use "
        "x.transpose(0, 1)"
    )


def test_transpose_to_seq_first_is_clean():
    clean(SeqFirst(fixed=True), torch.randn(B, S, D))


def test_views_that_keep_tokens_whole_are_clean():
    """Merging whole token axes (batch * seq, batch * heads) moves no data between tokens."""

    class Flat(nn.Module):
        d_model, n_heads, d_k = D, H, DK

        def forward(self, x):
            batch, seq, _ = x.shape
            tokens = x.reshape(batch * seq, D)  # [batch * seq, d_model]
            per_head = x.transpose(0, 1).reshape(seq, batch * H, DK)  # torch's own MHA layout
            return tokens.sum() + per_head.sum()

    clean(Flat(), torch.randn(B, S, D))


def test_view_mixing_is_an_error_in_strict_mode():
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(Heads("carve"), torch.randn(B, S, D), strict=True)
    assert info.value.kind == "view_mixes_axes"


def test_view_mixing_warns_at_the_users_line():
    with pytest.warns(ShapeWarning, match="carves heads out of the seq axis") as record:
        shapeguard.trace(Heads("carve"), torch.randn(B, S, D), mode="warn")
    assert record[0].filename == __file__
    assert record[0].lineno == _line_of("return t.view(batch, self.n_heads")


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)


# -- layouts -------------------------------------------------------------------------
class SdpaHeads(nn.Module):
    """SDPA self-attention; the bug leaves heads on axis 2, where SDPA wants seq."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.d_model, self.n_heads, self.d_k = D, H, DK
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split(self.d_model, dim=2)
        q = q.view(batch, seq, self.n_heads, self.d_k)  # [batch, seq, heads, d_k]
        k = k.view(batch, seq, self.n_heads, self.d_k)
        v = v.view(batch, seq, self.n_heads, self.d_k)
        if self.fixed:
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        if self.fixed:
            y = y.transpose(1, 2)
        return self.proj(y.reshape(batch, seq, self.d_model))


def test_sdpa_given_batch_seq_heads_d_k():
    first = only(findings(SdpaHeads(fixed=False), torch.randn(B, S, D)), "layout_bshd")
    assert first.message.splitlines()[0] == (
        "scaled_dot_product_attention: q is [batch, seq, heads, d_k]: SDPA reads axis 1 as heads "
        "and axis 2 as the sequence, so it attends across the 3 heads of each token instead of "
        "across the 5 tokens"
    )
    assert "  q      [batch=2, seq=5, heads=3, d_k=11] float32" in first.message
    assert first.hint.startswith("SDPA wants [batch, heads, seq, d_k]: pass q.transpose(1, 2)")


def test_sdpa_given_batch_heads_seq_d_k_is_clean():
    clean(SdpaHeads(fixed=True), torch.randn(B, S, D))


class Encoder(nn.Module):
    def __init__(self, batch_first, positions=True):
        super().__init__()
        self.positions = positions
        self.pos = nn.Embedding(16, D)
        self.attn = nn.MultiheadAttention(D, H, batch_first=batch_first)

    def forward(self, x):  # x: [batch, seq, d_model]
        if self.positions:  # positions of arange along axis 1: the sequence axis
            x = x + self.pos(torch.arange(x.shape[1]))
        context, _ = self.attn(x, x, x, need_weights=False)
        return x + context


def test_multihead_attention_without_batch_first_given_batch_first_input():
    first = only(findings(Encoder(batch_first=False), torch.randn(B, S, D)), "mha_batch_first")
    assert first.message.splitlines()[0] == (
        "MultiheadAttention(batch_first=False) got x [batch=2, seq=5, embed_dim=33]: it reads "
        "[seq, batch, embed_dim], so it attends across the 2 examples of the batch, once per token"
    )
    assert first.module == "attn (MultiheadAttention)"
    assert first.hint.startswith("build nn.MultiheadAttention(..., batch_first=True)")


def test_multihead_attention_with_batch_first_is_clean():
    clean(Encoder(batch_first=True), torch.randn(B, S, D))


@pytest.mark.parametrize("shape", [(S, B, D), (4, 4, D)], ids=["seq-first", "batch == seq"])
def test_seq_first_code_without_a_witness_is_clean(shape):
    """x [seq, batch, d_model] into batch_first=False is correct legacy code; with nothing
    but the input's usual layout to go on it reads exactly like the bug, so it is left alone."""
    clean(Encoder(batch_first=False, positions=False), torch.randn(*shape))


def test_seq_first_multihead_attention_at_the_root_is_clean():
    """At the root, nn.MultiheadAttention's own batch_first says what the axes are."""
    clean(
        nn.MultiheadAttention(D, H),
        torch.randn(S, B, D),
        torch.randn(S, B, D),
        torch.randn(S, B, D),
    )


def test_softmax_over_the_query_axis():
    first = only(findings(Heads("softmax_axis"), torch.randn(B, S, D)), "softmax_axis")
    assert first.message.splitlines()[0].startswith("softmax over seq_q (dim -2) of scores")
    assert (
        first.hint
        == "use softmax(scores, dim=-1) for scores laid out as [batch, heads, seq_q, seq_k]"
    )


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """RoPE self-attention on [batch, seq, heads, d_k]; the bug unsqueezes cos/sin on
    axis 1 (right for [batch, heads, seq, d_k]), which broadcasts only when seq == heads."""

    def __init__(self, fixed, n_heads, d_k=12):
        super().__init__()
        self.fixed = fixed
        self.n_heads, self.d_k, self.d_model = n_heads, d_k, n_heads * d_k
        self.W_q = nn.Linear(self.d_model, self.d_model)
        self.W_k = nn.Linear(self.d_model, self.d_model)
        self.W_v = nn.Linear(self.d_model, self.d_model)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, d_k, 2).double() / d_k)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.W_q(x).view(batch, seq, self.n_heads, self.d_k)
        k = self.W_k(x).view(batch, seq, self.n_heads, self.d_k)
        v = self.W_v(x).view(batch, seq, self.n_heads, self.d_k)
        freqs = torch.outer(torch.arange(seq).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)  # [seq, d_k]
        cos, sin = emb.cos()[None], emb.sin()[None]  # [1, seq, d_k]
        unsqueeze_dim = 2 if self.fixed else 1
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(batch, seq, self.d_model)


def test_rotary_applied_along_the_heads_axis():
    """seq == heads == 5: [1, 1, seq, d_k] cos broadcasts against [batch, seq, heads, d_k]."""
    found = findings(Rotary(fixed=False, n_heads=5), torch.randn(B, 5, 60))
    first = only(found, "rotary_axis")
    assert first.message.splitlines()[0] == (
        "q * cos: the positions of cos (axis -2, size 5) line up with q.heads (5), not with "
        "its sequence axis: each head gets one position's rotation"
    )
    assert first.hint.startswith("put the position axis of cos on the sequence axis of ")
    assert "(unsqueeze_dim=2)" in first.hint


def test_rotary_along_the_sequence_axis_is_clean():
    clean(Rotary(fixed=True, n_heads=5), torch.randn(B, 5, 60))
    clean(Rotary(fixed=True, n_heads=H), torch.randn(B, S, H * 12))


# -- masks -----------------------------------------------------------------------------
class Masked(nn.Module):
    """Hand-written attention whose mask is passed in already shaped for the scores."""

    def __init__(self):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = D, H, DK
        self.W_q = nn.Linear(D, D)
        self.W_k = nn.Linear(D, D)
        self.W_v = nn.Linear(D, D)

    def forward(self, x, mask):
        batch, seq, _ = x.shape
        Q = self.W_q(x).view(batch, seq, H, DK).transpose(1, 2)
        K = self.W_k(x).view(batch, seq, H, DK).transpose(1, 2)
        V = self.W_v(x).view(batch, seq, H, DK).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(DK)
        scores = scores.masked_fill(mask == 0, float("-inf"))
        return F.softmax(scores, dim=-1) @ V


def test_padding_mask_that_fits_the_scores_because_batch_equals_seq():
    """batch == seq == 5: a [batch, seq] mask lines up with [seq_q, seq_k]."""
    x, mask = torch.randn(5, 5, D), padding([5, 3, 4, 2, 5], 5)
    first = only(findings(Masked(), x, mask), "mask_axis")
    assert first.message.splitlines()[0] == (
        "masked_fill: mask == 0 [5, 5] lines up with [seq_q, seq_k] only because "
        "batch == seq_q == 5: its rows are the examples' padding, so example i's padding "
        "hides keys from query i of every example"
    )
    assert first.hint == (
        "a [batch, seq_k] padding mask goes on [batch, 1, 1, seq_k]: use "
        "(mask == 0)[:, None, None, :]"
    )
    clean(Masked(), x, mask[:, None, None, :])


def test_padding_mask_on_the_query_axis():
    x, mask = torch.randn(B, S, D), padding([5, 3], S)
    first = only(findings(Masked(), x, mask[:, None, :, None]), "mask_axis")
    assert first.message.splitlines()[0] == (
        "masked_fill: mask == 0 [2, 1, 5, 1] varies along seq_q and is broadcast along seq_k: "
        "it hides whole queries, and every query still sees the padded keys"
    )
    assert "[batch, 1, 1, seq_k]" in first.hint
    clean(Masked(), x, mask[:, None, None, :])


def test_causal_mask_that_keeps_the_future():
    """masked_fill(mask == 0) with a mask that is 1 above the diagonal."""
    x = torch.randn(B, S, D)
    future = torch.ones(S, S).triu(1)
    first = only(findings(Masked(), x, future), "mask_polarity")
    assert first.message.splitlines()[0] == (
        "masked_fill: mask == 0 hides each query's own position and every earlier one, and "
        "keeps the future: it is the inverse of a causal mask"
    )
    assert first.hint == (
        "masked_fill fills (hides) where the mask is True; a causal mask hides the keys after "
        "each query: pass mask != 0"
    )
    clean(Masked(), x, torch.ones(S, S).tril())


def test_causal_mask_that_hides_the_past():
    x = torch.randn(B, S, D)
    first = only(findings(Masked(), x, torch.ones(S, S).triu()), "mask_direction")
    assert first.message.splitlines()[0] == (
        "masked_fill: mask == 0 hides the past instead of the future: each query sees itself "
        "and later keys only"
    )
    assert first.hint.startswith("tril and triu are swapped")


class SdpaPadded(nn.Module):
    """SDPA with a key padding mask built from a [batch, seq] bool mask, True = padding."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed
        self.n_heads, self.d_k = H, DK
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x, key_padding_mask):
        batch, seq, _ = x.shape
        q, k, v = (t.view(batch, seq, H, DK).transpose(1, 2) for t in self.qkv(x).split(D, dim=-1))
        if self.fixed:
            keep = ~key_padding_mask[:, None, None, :]  # SDPA keeps True
        else:
            keep = key_padding_mask[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def test_sdpa_bool_mask_whose_true_marks_padding():
    x, pad = torch.randn(B, S, D), padding([5, 3], S) == 0
    first = only(findings(SdpaPadded(fixed=False), x, pad), "mask_polarity")
    assert first.message.splitlines()[0] == (
        "scaled_dot_product_attention: attn_mask hides every key of 1 example(s) and keeps "
        "the padding of the others: its True marks padding"
    )
    assert first.hint == (
        "SDPA keeps the keys where a bool attn_mask is True (the opposite of "
        "nn.MultiheadAttention's key_padding_mask): pass ~attn_mask"
    )
    clean(SdpaPadded(fixed=True), x, pad)


def test_sdpa_rows_that_hide_every_key():
    x, pad = torch.randn(B, S, D), padding([5, 0], S) == 0  # the second example is all padding
    first = only(findings(SdpaPadded(fixed=True), x, pad), "mask_fully_masked")
    assert first.message.splitlines()[0] == (
        "scaled_dot_product_attention: attn_mask hides every key from 15 of 30 query rows "
        "(first at batch 1, heads 0, query 0): SDPA returns zeros for them"
    )
    assert first.hint.startswith("each query must see at least one key")
    clean(SdpaPadded(fixed=True), x, padding([5, 2], S) == 0)  # every example has a token


class MhaMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, H, batch_first=True)

    def forward(self, x, key_padding_mask=None, attn_mask=None):
        out, _ = self.attn(
            x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False
        )
        return out


def test_key_padding_mask_whose_true_marks_real_tokens():
    x, real = torch.randn(B, S, D), padding([5, 3], S).bool()
    first = only(findings(MhaMasked(), x, key_padding_mask=real), "mask_polarity")
    assert first.message.splitlines()[0] == (
        "MultiheadAttention: key_padding_mask hides every key of 1 example(s) and keeps the "
        "padding of the others: its True marks the real tokens"
    )
    assert first.hint == "key_padding_mask is True where a key is padding: pass ~key_padding_mask"
    clean(MhaMasked(), x, key_padding_mask=~real)


def test_multihead_attention_bool_mask_that_keeps_the_past():
    x, keep = torch.randn(B, S, D), torch.ones(S, S, dtype=torch.bool).tril()
    first = only(findings(MhaMasked(), x, attn_mask=keep), "mask_polarity")
    assert first.message.splitlines()[0] == (
        "MultiheadAttention: attn_mask hides each query's own position and every earlier one, "
        "and keeps the future: it is the inverse of a causal mask"
    )
    assert "nn.MultiheadAttention hides the keys where attn_mask is True" in first.hint
    clean(MhaMasked(), x, attn_mask=~keep)


def test_multihead_attention_rows_that_hide_every_key():
    x, pad = torch.randn(B, S, D), padding([5, 0], S) == 0
    first = only(findings(MhaMasked(), x, key_padding_mask=pad), "mask_fully_masked")
    assert first.message.splitlines()[0].endswith(
        "hides every key from 15 of 30 query rows (first at batch 1, heads 0, query 0): "
        # need_weights=False: nn.MultiheadAttention calls SDPA, which returns zeros there.
        "nn.MultiheadAttention returns zeros for them"
    )
    clean(MhaMasked(), x, key_padding_mask=padding([5, 2], S) == 0)


class NanoCausal(nn.Module):
    """nanoGPT's causal self-attention; the bug uses the mask buffer without slicing it."""

    def __init__(self, fixed, block_size=S):
        super().__init__()
        self.fixed = fixed
        self.n_head, self.n_embd = H, D
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        bias = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", bias)

    def forward(self, x):
        B_, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B_, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.fixed:
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        else:
            att = att.masked_fill(self.bias == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B_, T, C)
        return self.c_proj(y)


def test_causal_buffer_used_whole():
    first = only(findings(NanoCausal(fixed=False), torch.randn(B, S, D)), "causal_buffer_unsliced")
    assert first.message.splitlines()[0] == (
        "masked_fill: bias == 0 is the whole buffer bias [1, 1, 5, 5]; it fits the scores "
        "[.., seq_q=5, seq_k=5] only because the sequence is as long as the buffer"
    )
    assert first.hint.startswith("slice it to the sequence, self.bias[:, :, :T, :T]")
    clean(NanoCausal(fixed=True), torch.randn(B, S, D))


class Cached(nn.Module):
    """One decoding step against a KV cache: 2 new queries, 7 keys."""

    def __init__(self, fixed):
        super().__init__()
        self.fixed = fixed

    def forward(self, q, k, v):
        if self.fixed:
            sq, sk = q.size(-2), k.size(-2)
            mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_is_causal_with_a_cache_aligns_the_triangle_top_left():
    q, k = torch.randn(B, H, 2, DK), torch.randn(B, H, 7, DK)
    first = only(findings(Cached(fixed=False), q, k, k), "causal_alignment")
    assert first.message.splitlines()[0] == (
        "scaled_dot_product_attention(is_causal=True) with seq_q=2 < seq_k=7: the causal "
        "triangle is aligned top-left, so query i sees keys 0..i only, not the 5 cached keys "
        "before it"
    )
    assert "tril(5)" in first.hint
    clean(Cached(fixed=True), q, k, k)


# -- axis provenance ------------------------------------------------------------------
class Flow(nn.Module):
    """Grouped-query attention through split, chunk, cat, repeat_interleave, expand,
    None-indexing, SDPA and masked_fill: 6 query heads, 3 kv heads, d_k 8."""

    def __init__(self):
        super().__init__()
        self.d_model, self.n_heads, self.n_kv_heads, self.head_dim = 48, 6, 3, 8
        self.qkv = nn.Linear(48, (6 + 2 * 3) * 8)

    def forward(self, x, pad):
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).split([48, 24, 24], dim=-1)
        q = q.view(batch, seq, 6, 8).transpose(1, 2)
        k = k.view(batch, seq, 3, 8).transpose(1, 2)
        v = v.view(batch, seq, 3, 8).transpose(1, 2)
        first, second = q.chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)
        keys = k.repeat_interleave(2, dim=1)
        values = v[:, :, None].expand(batch, 3, 2, seq, 8).reshape(batch, 6, seq, 8)
        keep = pad[:, None, None, :]
        context = F.scaled_dot_product_attention(rotated, keys, values, attn_mask=keep)
        scores = (rotated @ keys.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
        attn = scores.softmax(dim=-1)
        return attn.sum() + context.transpose(1, 2).reshape(batch, seq, 48)


def test_axis_names_follow_the_data():
    trace = shapeguard.trace(Flow(), torch.randn(2, 5, 48), torch.ones(2, 5, dtype=torch.bool))
    named = {e.label: e.outputs[0].named_shape for e in trace.events if e.label}
    assert named["q"] == "[batch=2, heads=6, seq=5, d_k=8]"
    assert named["k"] == "[batch=2, kv_heads=3, seq=5, d_k=8]"
    assert named["first"] == "[batch=2, heads=6, seq=5, d_k=4]"  # a chunk of d_k is still d_k
    assert named["rotated"] == "[batch=2, heads=6, seq=5, d_k=8]"
    assert named["keys"] == "[batch=2, heads=6, seq=5, d_k=8]"  # repeat_interleave: kv -> heads
    assert named["values"] == "[batch=2, heads=6, seq=5, d_k=8]"
    assert named["keep"] == "[batch=2, 1, 1, seq=5]"
    sdpa = next(e for e in trace.events if e.op == "scaled_dot_product_attention")
    assert sdpa.label == "context"
    assert sdpa.outputs[0].named_shape == "[batch=2, heads=6, seq=5, d_k=8]"
    # transpose(1, 2) keeps the name (^T is for a matrix transpose of the last two axes).
    assert named["context"] == "[batch=2, seq=5, heads=6, d_k=8]"
    assert named["scores"] == "[batch=2, heads=6, seq_q=5, seq_k=5]"
    assert named["attn"] == "[batch=2, heads=6, seq_q=5, seq_k=5]"
    split = next(e for e in trace.events if e.op == "split")
    assert [o.label for o in split.outputs] == ["q", "k", "v"]
    assert split.outputs[1].named_shape == "[batch=2, seq=5, 24]"  # every output is named
    expand = next(e for e in trace.events if e.op == "expand")
    # n_rep == batch == 2: the repeat axis is a copy, not a second batch axis.
    assert expand.outputs[0].named_shape == "[batch=2, kv_heads=3, 2, seq=5, d_k=8]"
    cat = next(e for e in trace.events if e.op == "cat")
    assert [r.named_shape for r in cat.inputs] == ["[batch=2, heads=6, seq=5, d_k=4]"] * 2


def test_head_split_is_named_even_when_sizes_coincide():
    """seq == heads == 5: the vocabulary cannot tell them apart, the view's structure can."""
    trace = shapeguard.trace(Heads(n_heads=5, d_model=55), torch.randn(B, 5, 55))
    view = next(e for e in trace.events if e.op == "view")
    assert view.outputs[0].axes[2:] == ("heads", "d_k")


def test_on_the_meta_device_names_are_checked_and_values_are_not_read():
    found = findings(Heads("carve").to("meta"), torch.randn(B, S, D, device="meta"))
    assert {f.kind for f in found} == {"view_mixes_axes"}
    future = torch.ones(S, S, device="meta").triu(1)  # polarity needs values: not read on meta
    assert findings(Masked().to("meta"), torch.randn(B, S, D, device="meta"), future) == []


class SdpaMasked(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.d_k = H, DK

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_sdpa_bool_mask_that_marks_the_future():
    """True above the diagonal is nn.MultiheadAttention's convention; SDPA keeps True."""
    q = torch.randn(B, H, S, DK)
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    first = only(findings(SdpaMasked(), q, q, q, future), "mask_polarity")
    assert first.message.splitlines()[0] == (
        "scaled_dot_product_attention: attn_mask hides each query's own position and every "
        "earlier one, and keeps the future: it is the inverse of a causal mask"
    )
    assert first.hint == (
        "SDPA keeps the keys where a bool attn_mask is True; a causal mask hides the keys after "
        "each query: pass ~attn_mask"
    )
    clean(SdpaMasked(), q, q, q, ~future)
