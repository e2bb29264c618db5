"""The reach recorded at every attention site (issue 28, part 1): which keys each query
sees, read from the values that reach softmax or the kernel, whatever code built the mask;
kept on the trace folded and bounded; never changing what the program computes.

Each case builds its mask in one style and states the keys each query must see as a plain
bool tensor `[batch, heads, seq_q, seq_k]` built independently (loops over lengths, not
the code under test); the recorded reach must give exactly those rows, at pairwise
distinct, coincident and realistic sizes.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from trace_helpers import REACH_SETTING as SETTING
from trace_helpers import REACH_SETTINGS as SETTINGS
from trace_helpers import ReachSizes as Sizes

import shapeguard
from shapeguard._reach.rows import MAX_QUERIES, Reach
from shapeguard._trace import record as _record

# These tests read the traces they open; the plugin's background trace stays out.
pytestmark = pytest.mark.no_shapeguard


# -- what each query must see, built by hand ---------------------------------------------------
def expected(batch: int, heads: int, sq: int, sk: int, sees) -> torch.Tensor:
    """bool [batch, heads, sq, sk]: `sees(b, h, q, k)` for each cell."""
    out = torch.zeros(batch, heads, sq, sk, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads):
            for q in range(sq):
                for k in range(sk):
                    out[b, h, q, k] = bool(sees(b, h, q, k))
    return out


def assert_reach(reach: Reach, want: torch.Tensor) -> None:
    """Every (example, head, query) row of `reach` is `want`'s."""
    batch, heads, sq, sk = want.shape
    assert reach.lead == (batch, heads) and (reach.seq_q, reach.seq_k) == (sq, sk)
    for b in range(batch):
        for h in range(heads):
            got = reach.visible((b, h))
            rows = want[b, h][list(reach.kept_queries)]
            assert torch.equal(got, rows), f"example {b}, head {h}: {got.int()} != {rows.int()}"


def sites(trace, op: str) -> list[Reach]:
    return [r for r in trace.reach if r.op == op]


def qkv(sizes: Sizes, sk: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, h, s, d = sizes.batch, sizes.heads, sizes.seq, sizes.d_k
    sk = s if sk is None else sk
    return (
        torch.randn(b, h, s, d, generator=g),
        torch.randn(b, h, sk, d, generator=g),
        torch.randn(b, h, sk, d, generator=g),
    )


# -- hand-written attention in several mask styles ---------------------------------------------
class Scores(nn.Module):
    """softmax(Q K^T / sqrt(d) masked in `style`) V."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style

    def forward(self, q, k, v, lengths=None):
        B, H, S, D = q.shape
        T = k.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)
        if self.style == "masked_fill_triu":
            future = torch.triu(torch.ones(S, T, dtype=torch.bool, device=q.device), diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
        elif self.style == "additive_inf":
            scores = scores + torch.full((S, T), float("-inf")).triu(1)
        elif self.style == "additive_finfo_min":
            bias = torch.zeros(S, T).masked_fill(
                torch.ones(S, T, dtype=torch.bool).triu(1), torch.finfo(q.dtype).min
            )
            scores = scores + bias
        elif self.style == "where_keep":
            keep = torch.ones(S, T, dtype=torch.bool).tril()
            scores = torch.where(keep, scores, torch.tensor(-1e9))
        elif self.style == "padding_added":
            real = torch.arange(T)[None, :] < torch.as_tensor(lengths)[:, None]  # [B, T]
            pad = torch.zeros(B, 1, 1, T).masked_fill(~real[:, None, None, :], -1e9)
            scores = scores + pad
        elif self.style == "causal_and_padding":
            real = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
            keep = torch.ones(S, T, dtype=torch.bool).tril()[None, None] & real[:, None, None, :]
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        attn = F.softmax(scores, dim=-1)
        return attn @ v


CAUSAL_STYLES = ("masked_fill_triu", "additive_inf", "additive_finfo_min", "where_keep")


@SETTING
@pytest.mark.parametrize("style", CAUSAL_STYLES)
def test_a_causal_mask_in_any_style_records_the_triangle(sizes, style):
    q, k, v = qkv(sizes)
    with shapeguard.trace() as t:
        Scores(style)(q, k, v)
    (reach,) = sites(t, "softmax")
    b, h, s = sizes.batch, sizes.heads, sizes.seq
    assert_reach(reach, expected(b, h, s, s, lambda _b, _h, i, j: j <= i))
    assert reach.stored == (1, 1), "one causal triangle for every example and head"
    assert reach.how == "mask" and reach.count == 1
    assert reach.module == "" and "test_reach_sites.py:" in reach.location


@SETTING
def test_a_padding_mask_added_as_b_1_1_s_records_each_examples_keys(sizes):
    q, k, v = qkv(sizes)
    lengths = sizes.lengths()
    with shapeguard.trace() as t:
        Scores("padding_added")(q, k, v, lengths)
    (reach,) = sites(t, "softmax")
    b, h, s = sizes.batch, sizes.heads, sizes.seq
    assert_reach(reach, expected(b, h, s, s, lambda bb, _h, _i, j: j < lengths[bb]))
    assert reach.stored == (b, 1), "padding differs by example, never by head"


@SETTING
def test_causal_and_padding_combined_record_both(sizes):
    q, k, v = qkv(sizes)
    lengths = sizes.lengths()
    with shapeguard.trace() as t:
        Scores("causal_and_padding")(q, k, v, lengths)
    (reach,) = sites(t, "softmax")
    b, h, s = sizes.batch, sizes.heads, sizes.seq
    assert_reach(reach, expected(b, h, s, s, lambda bb, _h, i, j: j <= i and j < lengths[bb]))


@SETTING
def test_unmasked_scores_give_full_rows(sizes):
    q, k, v = qkv(sizes)
    with shapeguard.trace() as t:
        Scores("none")(q, k, v)
    (reach,) = sites(t, "softmax")
    b, h, s = sizes.batch, sizes.heads, sizes.seq
    assert_reach(reach, torch.ones(b, h, s, s, dtype=torch.bool))
    assert reach.how == "unmasked" and len(reach.patterns) == 1


def test_a_softmax_over_a_tensor_no_query_key_product_made_records_nothing():
    x = torch.randn(3, 7, 5)
    with shapeguard.trace() as t:
        F.softmax(x.masked_fill(torch.ones(7, 5, dtype=torch.bool).triu(1), -1e9), dim=-1)
    assert t.reach == []


def test_a_softmax_over_the_queries_records_nothing():
    q, k, _ = qkv(SETTINGS[0])
    # q and k are two inputs, so no softmax_axis at the softmax (queries that are not the keys
    # wait for the product with V, which is not made here): what matters is that no reach is kept.
    with shapeguard.trace(mode="warn") as t:
        F.softmax(q @ k.transpose(-2, -1), dim=-2)
    assert t.reach == []


# -- SDPA ----------------------------------------------------------------------------------------
@SETTING
def test_sdpa_bool_keep_mask_records_what_it_keeps(sizes):
    q, k, v = qkv(sizes, sizes.seq_k)
    kl = sizes.key_lengths()
    b, h, s, sk = sizes.batch, sizes.heads, sizes.seq, sizes.seq_k
    keep = (torch.arange(sk)[None, :] < torch.tensor(kl)[:, None])[:, None, None, :]
    with shapeguard.trace() as t:
        F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    (reach,) = sites(t, "scaled_dot_product_attention")
    assert_reach(reach, expected(b, h, s, sk, lambda bb, _h, _i, j: j < kl[bb]))
    assert reach.how == "mask"


@SETTING
def test_sdpa_float_mask_hides_where_it_is_minus_inf_or_finfo_min(sizes):
    q, k, v = qkv(sizes)
    b, h, s = sizes.batch, sizes.heads, sizes.seq
    mask = torch.zeros(s, s)
    mask[:, 0] = float("-inf")
    mask.masked_fill_(torch.ones(s, s, dtype=torch.bool).triu(1), torch.finfo(torch.float32).min)
    mask[:, 0] = 0.0  # the first key back: every row keeps one
    with shapeguard.trace() as t:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    (reach,) = sites(t, "scaled_dot_product_attention")
    assert_reach(reach, expected(b, h, s, s, lambda _b, _h, i, j: j <= i))


@SETTING
def test_sdpa_is_causal_is_the_top_left_triangle_also_with_fewer_queries(sizes):
    q, k, v = qkv(sizes, sizes.seq_k)
    b, h, s, sk = sizes.batch, sizes.heads, sizes.seq, sizes.seq_k
    with shapeguard.trace(mode="warn") as t:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (reach,) = sites(t, "scaled_dot_product_attention")
    assert_reach(reach, expected(b, h, s, sk, lambda _b, _h, i, j: j <= i))
    assert reach.how == "causal" and reach.stored == (1, 1)


def test_sdpa_with_grouped_heads_records_the_query_heads():
    q = torch.randn(3, 4, 7, 16)
    k = v = torch.randn(3, 2, 7, 16)
    with shapeguard.trace() as t:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (reach,) = sites(t, "scaled_dot_product_attention")
    assert_reach(reach, expected(3, 4, 7, 7, lambda _b, _h, i, j: j <= i))


# -- nn.MultiheadAttention -----------------------------------------------------------------------
def _mha(sizes: Sizes, batch_first: bool) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    return nn.MultiheadAttention(sizes.heads * sizes.d_k, sizes.heads, batch_first=batch_first)


@SETTING
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "sequence_first"])
def test_mha_key_padding_mask_records_each_examples_keys(sizes, batch_first):
    b, h, s, e = sizes.batch, sizes.heads, sizes.seq, sizes.heads * sizes.d_k
    lengths = sizes.lengths()
    mha = _mha(sizes, batch_first)
    x = torch.randn(b, s, e) if batch_first else torch.randn(s, b, e)
    padded = torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]  # True hides
    with shapeguard.trace() as t:
        mha(x, x, x, key_padding_mask=padded)
    (reach,) = sites(t, "multi_head_attention_forward")
    assert_reach(reach, expected(b, h, s, s, lambda bb, _h, _i, j: j < lengths[bb]))
    assert reach.lead_axes == ("batch", "heads")


@SETTING
def test_mha_causal_and_padding_combined_as_torch_combines_them(sizes):
    b, h, s, e = sizes.batch, sizes.heads, sizes.seq, sizes.heads * sizes.d_k
    lengths = sizes.lengths()
    mha = _mha(sizes, batch_first=False)
    x = torch.randn(s, b, e)
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    padded = torch.arange(s)[None, :] >= torch.tensor(lengths)[:, None]
    with shapeguard.trace() as t:
        mha(x, x, x, attn_mask=future, key_padding_mask=padded)
    (reach,) = sites(t, "multi_head_attention_forward")
    assert_reach(reach, expected(b, h, s, s, lambda bb, _h, i, j: j <= i and j < lengths[bb]))


# -- kept on the trace: folded, bounded, never changing the program -----------------------------
class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = Scores("masked_fill_triu")
        self.second = Scores("masked_fill_triu")

    def forward(self, q, k, v):
        return self.second(self.first(q, k, v), k, v)


def test_repeats_at_one_site_fold_and_other_sites_stay_apart():
    q, k, v = qkv(SETTINGS[0])
    model = TwoLayers()
    with shapeguard.trace() as t:
        for _ in range(3):
            model(q, k, v)
    found = sites(t, "softmax")
    assert [r.module for r in found] == ["first", "second"]
    assert [r.count for r in found] == [3, 3]
    assert found[0].event < found[1].event


def test_the_number_of_distinct_reaches_is_bounded(monkeypatch):
    monkeypatch.setattr(_record, "MAX_REACH", 2)
    model = Scores("padding_added")
    with shapeguard.trace() as t:
        for n in range(1, 6):  # another padding each time: another reach
            q, k, v = qkv(SETTINGS[0])
            model(q, k, v, [7, n, 1])
    assert len(t.reach) == 2 and t.reach_dropped == 3


def test_a_replayed_forward_with_other_padding_records_its_own_reach():
    """Sessions of one opener replay from the third on: a forward whose mask has other
    values (another batch's padding) still records its own reach, and the replay goes on."""
    model = Scores("padding_added")
    q, k, v = qkv(SETTINGS[0])
    batches = [[7, 5, 3], [7, 5, 3], [7, 5, 3], [6, 2, 4], [7, 5, 3]]
    traces = []
    for lengths in batches:
        given = torch.tensor(lengths)
        with shapeguard.trace() as t:
            model(q, k, v, given)
        traces.append(t)
    for t in traces[2:]:
        assert t._replayed == t._steps and not t.replay_stops, "replayed whole"
    for lengths, t in zip(batches, traces, strict=True):
        (reach,) = sites(t, "softmax")
        assert_reach(reach, expected(3, 4, 7, 7, lambda bb, _h, _i, j, n=lengths: j < n[bb]))


def test_nothing_is_recorded_on_meta_tensors():
    q, k, v = (x.to("meta") for x in qkv(SETTINGS[0]))
    with shapeguard.trace() as t:
        Scores("masked_fill_triu")(q, k, v)
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert t.reach == []


@pytest.mark.parametrize("style", ["padding_added", *CAUSAL_STYLES])
def test_outputs_are_bitwise_identical_and_no_tensor_is_kept(style):
    q, k, v = qkv(SETTINGS[2])
    lengths = SETTINGS[2].lengths()
    plain = Scores(style)(q, k, v, lengths)
    with shapeguard.trace() as t:
        traced = Scores(style)(q, k, v, lengths)
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(traced, plain) and torch.equal(
        sdpa, F.scaled_dot_product_attention(q, k, v, is_causal=True)
    )
    for reach in t.reach:
        assert not any(isinstance(getattr(reach, f), torch.Tensor) for f in reach.__slots__)


def test_long_sequences_keep_a_sample_of_queries():
    s = 1024
    q = torch.randn(1, 2, s, 8)
    with shapeguard.trace() as t:
        F.softmax(
            (q @ q.transpose(-2, -1)).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), -1e9),
            dim=-1,
        )
    (reach,) = sites(t, "softmax")
    assert reach.queries is not None and len(reach.queries) == MAX_QUERIES
    assert reach.row((1, 1), s - 1) == ((0, s),) and reach.row((0, 0), 3) == ((0, 4),)


# -- shapeguard.attention's flash path -----------------------------------------------------------
@SETTING
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_flash_attention_causal_is_aligned_bottom_right(sizes, layout):
    from shapeguard.attention import flash_attention

    b, h, s, sk, d = sizes.batch, sizes.heads, sizes.seq, sizes.seq + 2, sizes.d_k
    shape_q, shape_k = (
        ((b, s, h, d), (b, sk, h, d)) if layout == "bshd" else ((b, h, s, d), (b, h, sk, d))
    )
    q, k = torch.randn(shape_q), torch.randn(shape_k)
    with shapeguard.trace() as t:
        flash_attention(q, k, k, causal=True, layout=layout, backend="sdpa")
    (reach,) = sites(t, "flash_attention")
    assert_reach(reach, expected(b, h, s, sk, lambda _b, _h, i, j: j <= i + sk - s))
    assert reach.how == "causal"


@SETTING
def test_flash_attention_window_sees_exactly_its_window(sizes):
    from shapeguard.attention import flash_attention

    b, h, s, d = sizes.batch, sizes.heads, sizes.seq, sizes.d_k
    q = torch.randn(b, s, h, d)
    with shapeguard.trace() as t:
        flash_attention(q, q, q, causal=True, window_size=(2, -1), backend="sdpa")
        flash_attention(q, q, q, window_size=(1, 1), backend="sdpa")
    causal, both = sites(t, "flash_attention")
    assert_reach(causal, expected(b, h, s, s, lambda _b, _h, i, j: i - 2 <= j <= i))
    assert_reach(both, expected(b, h, s, s, lambda _b, _h, i, j: abs(i - j) <= 1))
    assert causal.how == both.how == "window"


def test_a_background_trace_collects_the_reach_of_traces_opened_inside_it():
    """The pytest plugin's background trace gathers what the traces inside it saw,
    findings and reach alike, folded."""
    q, k, v = qkv(SETTINGS[0])
    with shapeguard.Trace(background=True) as outer:
        for _ in range(2):
            with shapeguard.trace() as inner:
                Scores("masked_fill_triu")(q, k, v)
    assert [r.count for r in inner.reach] == [1]
    (reach,) = outer.reach
    assert reach.count == 2 and reach.op == "softmax"


# -- transformers models, left padded (their masks built by their own code) ----------------------
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_left_padded_llama_records_each_examples_causal_rows(impl):
    import os
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    import real_models

    config = real_models.Config(f"llama-{impl}-left-distinct", "llama", impl, "left", "distinct")
    model, args, kwargs = real_models.build(config)
    real = kwargs["attention_mask"].bool()
    b, s = real.shape
    with torch.no_grad(), shapeguard.trace() as t:
        model(*args, **kwargs)
    op = "softmax" if impl == "eager" else "scaled_dot_product_attention"
    found = sites(t, op)
    assert [r.module for r in found] == [f"model.layers.{i}.self_attn" for i in range(len(found))]
    assert len(found) >= 2
    heads = found[0].lead[1]
    # A real query sees the real keys up to itself; a padded query (left) sees none.
    want = expected(
        b, heads, s, s, lambda bb, _h, i, j: bool(real[bb, i] and real[bb, j]) and j <= i
    )
    for reach in found:
        assert_reach(reach, want)


def test_reach_off_reads_nothing():
    from shapeguard.checks import reach

    q, k, v = qkv(SETTINGS[0])
    with reach.off(), shapeguard.trace() as t:
        Scores("masked_fill_triu")(q, k, v)
    assert t.reach == []
    with shapeguard.trace() as t:
        Scores("masked_fill_triu")(q, k, v)
    assert len(t.reach) == 1


def test_nested_and_sparse_tensors_are_not_read():
    from shapeguard.checks._reach_read import readable

    nested = torch.nested.nested_tensor([torch.randn(2, 5), torch.randn(3, 5)], layout=torch.jagged)
    sparse = torch.randn(4, 4).to_sparse()
    assert not readable(nested) and not readable(sparse) and readable(torch.randn(4, 4))


def test_a_transformer_layer_on_its_fast_path_records_its_attention():
    """nn.TransformerEncoderLayer in eval and no_grad is checked at its boundary (the
    composite keeps torch's fused kernel): its attention's reach is kept all the same."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).eval()
    x = torch.randn(3, 7, 64)
    lengths = [7, 5, 2]
    padded = torch.arange(7)[None, :] >= torch.tensor(lengths)[:, None]
    with torch.no_grad(), shapeguard.trace() as t:
        plain_free = layer(x, src_key_padding_mask=padded)
    (reach,) = sites(t, "multi_head_attention_forward")
    assert reach.module == "self_attn"
    assert_reach(reach, expected(3, 4, 7, 7, lambda bb, _h, _i, j: j < lengths[bb]))
    with torch.no_grad():
        assert torch.equal(plain_free, layer(x, src_key_padding_mask=padded))


def test_log_softmax_over_masked_scores_records_the_same_reach():
    q, k, _ = qkv(SETTINGS[0])
    s = SETTINGS[0].seq
    with shapeguard.trace() as t:
        scores = (q @ k.transpose(-2, -1)).masked_fill(
            torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf")
        )
        F.log_softmax(scores, dim=-1)
    (reach,) = sites(t, "log_softmax")
    assert_reach(reach, expected(3, 4, s, s, lambda _b, _h, i, j: j <= i))


def test_mha_is_causal_without_weights_is_the_triangle_torch_uses():
    """With is_causal=True, no key_padding_mask and need_weights=False, torch drops the
    attn_mask and has SDPA apply its own triangle: that triangle is what the queries see."""
    sizes = SETTINGS[0]
    b, h, s, e = sizes.batch, sizes.heads, sizes.seq, sizes.heads * sizes.d_k
    mha = _mha(sizes, batch_first=True)
    x = torch.randn(b, s, e)
    nothing_hidden = torch.zeros(s, s, dtype=torch.bool)  # only a hint, by torch's contract
    with shapeguard.trace() as t:
        mha(x, x, x, attn_mask=nothing_hidden, is_causal=True, need_weights=False)
    (reach,) = sites(t, "multi_head_attention_forward")
    assert_reach(reach, expected(b, h, s, s, lambda _b, _h, i, j: j <= i))
    assert reach.how == "causal"
