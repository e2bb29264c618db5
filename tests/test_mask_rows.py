"""Query rows that hide every key, judged by what the query is.

A padded query's row hides every key in a correct left-padded decoder (the layout of
batched generation) and in encoders that hide padded query rows too (DeBERTa-v2): those
are silent. A real token's row that sees nothing (a causal mask shifted by one, a cache
offset dropped) and an example with no visible key at all are reported, with what the op
really returns there; each test checks that claim against the op's own output.

Every case runs at three size settings: pairwise distinct, coincident (batch == heads ==
seq == d_k), and realistic.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning

# These tests provoke ShapeWarnings on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

SIZES = {
    "distinct": (2, 3, 5, 11),  # batch, heads, seq, d_k
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
sizes = pytest.mark.parametrize("size", list(SIZES.values()), ids=list(SIZES))

NAN = "softmax gives NaN there"
EVEN = "softmax spreads those rows evenly over every key, hidden ones included"
ON_HIDDEN = "softmax puts all of those rows' weight on hidden keys"
SDPA_ZEROS = "SDPA returns zeros for them"
SDPA_EVEN = (
    "SDPA spreads those rows evenly over every key, hidden ones included (each gives the mean of V)"
)
REAL_HINT = (
    "each query must see at least one key, and other queries see these rows' own positions as "
    "keys, so the mask treats them as real tokens: if they are padding, hide them as keys too "
    "(padding goes on the key axis, [batch, 1, 1, seq_k]); else check the mask's polarity ({}) "
    "and that a causal mask hides only the keys after each query, never its own"
)
EMPTY_HINT = (
    "each query must see at least one key: an example whose queries see no key is all "
    "padding (drop it from the batch) or its mask has the wrong polarity ({})"
)
READS = {
    "masked_fill": "masked_fill hides where the mask is True",
    "torch.where": "torch.where keeps the scores where the condition is True",
    "scores + mask": "an additive mask is 0 where a key is kept and very negative where it is "
    "hidden",
    "sdpa_bool": "SDPA keeps the keys where a bool attn_mask is True",
    "sdpa_float": "an additive mask is 0 where a key is kept and very negative where it is hidden",
    "mha": "nn.MultiheadAttention hides the keys where attn_mask or key_padding_mask is True, "
    "or -inf in a float mask",
}


def pads(batch, seq):
    """Pad tokens per example: example 0 the most, the last none."""
    return [(batch - 1 - i) * (seq // 2) // (batch - 1) for i in range(batch)]


def left_padded(batch, seq):
    """[batch, seq] attention_mask, 1 = real token, padding on the left."""
    return (torch.arange(seq)[None, :] >= torch.tensor(pads(batch, seq))[:, None]).long()


def right_padded(batch, seq):
    return left_padded(batch, seq).flip(-1)


def findings(model, *args, **kwargs):
    """Findings of one traced forward in warn mode, with the ShapeWarnings caught."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad():
            trace = shapeguard.trace(model, *args, mode="warn", **kwargs)
    return trace.findings


def fully_masked(found):
    return [f for f in found if f.kind == "mask_fully_masked"]


def reported(model, *args, **kwargs):
    """The one mask_fully_masked finding, and nothing else."""
    found = findings(model, *args, **kwargs)
    assert [f.kind for f in found] == ["mask_fully_masked"], [f.message for f in found]
    return found[0]


# -- hand-written attention, masked in each way the check reads ------------------------------
def attend(style, q, k, v, keep):
    """Attention over [batch, heads, seq, d_k] with a bool `keep` (True = attend); returns
    the weights (None for SDPA) and the context."""
    if style.startswith("sdpa"):
        if style == "sdpa_bool":
            return None, F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        bias = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
        return None, F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if style == "fill_inf":
        scores = scores.masked_fill(~keep, float("-inf"))
    elif style == "fill_min":
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    elif style == "fill_1e9":
        scores = scores.masked_fill(~keep, -1e9)
    elif style == "where_min":
        scores = torch.where(keep, scores, torch.finfo(scores.dtype).min)
    elif style == "add_min":
        bias = torch.zeros(keep.shape, dtype=scores.dtype).masked_fill(
            ~keep, torch.finfo(scores.dtype).min
        )
        scores = scores + bias
    elif style == "add_inf":
        bias = torch.zeros(keep.shape, dtype=scores.dtype).masked_fill(~keep, float("-inf"))
        scores = scores + bias
    attn = scores.softmax(dim=-1)
    return attn, attn @ v


class Attention(nn.Module):
    """Self-attention with a [batch, 1, seq_q, seq_k] mask that combines the padding of a
    [batch, seq] attention_mask with a causal triangle (decoder) or with the padding of the
    queries too (encoder, DeBERTa-v2's layout). The bugs: `shift` hides each query's own
    key, `invert` flips the attention_mask of one example, `top_left` aligns the triangle
    of a cached chunk (seq_q < seq_k) top-left."""

    def __init__(self, heads, d_k, style, causal=True, shift=False, invert=None, top_left=False):
        super().__init__()
        self.n_heads, self.d_k, self.style = heads, d_k, style
        self.causal, self.shift, self.invert, self.top_left = causal, shift, invert, top_left
        self.qkv = nn.Linear(heads * d_k, 3 * heads * d_k)

    def forward(self, x, attention_mask, queries=None):
        batch, seq, width = x.shape
        q, k, v = (
            t.view(batch, seq, self.n_heads, self.d_k).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=-1)
        )
        sq = seq if queries is None else queries
        q = q[:, :, seq - sq :]  # with a cache, the new queries are the last positions
        real = attention_mask.bool().clone()
        if self.invert is not None:
            real[self.invert] = ~real[self.invert]
        keep = real[:, None, None, :]
        if self.causal:
            diagonal = (0 if self.top_left else seq - sq) - (1 if self.shift else 0)
            keep = keep & torch.ones(sq, seq, dtype=torch.bool).tril(diagonal)
        else:
            keep = keep & real[:, None, :, None]
        attn, context = attend(self.style, q, k, v, keep)
        self.last = {"attn": attn, "context": context, "v": v}
        return context


def inputs(size, layout=left_padded):
    batch, heads, seq, d_k = size
    torch.manual_seed(0)
    return torch.randn(batch, seq, heads * d_k), layout(batch, seq)


STYLES = ["fill_inf", "fill_min", "fill_1e9", "where_min", "add_min", "add_inf"]
SDPA_STYLES = ["sdpa_bool", "sdpa_float"]


@sizes
@pytest.mark.parametrize("style", STYLES + SDPA_STYLES)
def test_left_padded_causal_attention_is_silent(size, style):
    batch, heads, seq, d_k = size
    x, mask = inputs(size)
    model = Attention(heads, d_k, style)
    assert fully_masked(findings(model, x, mask)) == []
    # The layout does have rows that hide every key: the pad tokens' own queries.
    assert pads(batch, seq)[0] > 0


@sizes
@pytest.mark.parametrize("style", ["fill_min", "add_min", "sdpa_bool", "sdpa_float"])
def test_right_padded_encoder_that_hides_padded_queries_is_silent(size, style):
    _, heads, _, d_k = size
    x, mask = inputs(size, right_padded)
    assert fully_masked(findings(Attention(heads, d_k, style, causal=False), x, mask)) == []


@sizes
@pytest.mark.parametrize("style", ["fill_inf", "add_min", "sdpa_bool"])
def test_left_padded_chunk_with_a_cache_is_silent(size, style):
    """seq_q = seq_k - 1: query i is position i + 1, and some of those are padding."""
    _, heads, seq, d_k = size
    x, mask = inputs(size)
    model = Attention(heads, d_k, style)
    assert fully_masked(findings(model, x, mask, queries=seq - 1)) == []


# -- real bugs: what is reported, and what the op really returns there ------------------------
def route(style):
    return {
        "fill_inf": ("masked_fill", "~keep", NAN),
        "fill_min": ("masked_fill", "~keep", EVEN),
        "fill_1e9": ("masked_fill", "~keep", EVEN),
        "where_min": ("torch.where", "keep", EVEN),
        "add_min": ("scores + mask", "bias", EVEN),
        "add_inf": ("scores + mask", "bias", NAN),
        "sdpa_bool": ("scaled_dot_product_attention", "attn_mask", SDPA_ZEROS),
        "sdpa_float": ("scaled_dot_product_attention", "attn_mask", SDPA_EVEN),
    }[style]


def reads(style):
    op = route(style)[0]
    return READS[style if style.startswith("sdpa") else op]


def assert_effect(model, effect, at):
    """The effect the message claims is what the op returned at row `at`."""
    attn, context, v = model.last["attn"], model.last["context"], model.last["v"]
    b, h, i = at
    if effect == NAN:
        assert bool(attn[b, h, i].isnan().all())
    elif effect == EVEN:
        row = attn[b, h, i]
        assert torch.allclose(row, torch.full_like(row, 1 / row.numel()))
    elif effect == SDPA_ZEROS:
        assert bool((context[b, h, i] == 0).all())
    elif effect == SDPA_EVEN:
        assert torch.allclose(context[b, h, i], v[b, h].mean(0), atol=1e-5)
    else:
        raise AssertionError(effect)


@sizes
@pytest.mark.parametrize("style", STYLES + SDPA_STYLES)
def test_shifted_causal_mask_hides_every_key_from_the_first_real_token(size, style):
    """tril(-1): each query hides its own key, so the first real token of every example sees
    only padding, or nothing."""
    batch, heads, seq, d_k = size
    x, mask = inputs(size)
    model = Attention(heads, d_k, style, shift=True)
    found = reported(model, x, mask)
    op, label, effect = route(style)
    first = pads(batch, seq)[0]
    assert found.message.splitlines()[0] == (
        f"{op}: {label} hides every key from {batch * heads} of {batch * heads * seq} query "
        f"rows (first at batch 0, heads 0, query {first}): {effect}"
    )
    assert found.hint == REAL_HINT.format(reads(style))
    assert_effect(model, effect, (0, 0, first))


@sizes
@pytest.mark.parametrize("style", STYLES + SDPA_STYLES)
@pytest.mark.parametrize("causal", [True, False], ids=["decoder", "encoder"])
def test_polarity_inverted_for_one_example_leaves_it_no_key(size, style, causal):
    """The last example has no padding; its attention_mask inverted hides every key."""
    batch, heads, seq, d_k = size
    x, mask = inputs(size, left_padded if causal else right_padded)
    model = Attention(heads, d_k, style, causal=causal, invert=batch - 1)
    found = reported(model, x, mask)
    op, label, effect = route(style)
    assert found.message.splitlines()[0] == (
        f"{op}: {label} hides every key from {heads * seq} of {batch * heads * seq} query rows "
        f"(first at batch {batch - 1}, heads 0, query 0): {effect}"
    )
    assert found.hint == EMPTY_HINT.format(reads(style))
    assert_effect(model, effect, (batch - 1, 0, 0))


@sizes
@pytest.mark.parametrize("style", ["fill_inf", "add_min", "sdpa_bool"])
def test_cached_chunk_with_a_top_left_triangle(size, style):
    """seq_q = seq_k - 1 and the triangle aligned top-left: query i (position i + 1) sees
    keys 0..i only, so the first real token of a padded example sees only padding."""
    batch, heads, seq, d_k = size
    x, mask = inputs(size)
    model = Attention(heads, d_k, style, top_left=True)
    found = reported(model, x, mask, queries=seq - 1)
    op, label, effect = route(style)
    padded = sum(1 for p in pads(batch, seq) if p > 0)
    first = pads(batch, seq)[0] - 1
    assert found.message.splitlines()[0] == (
        f"{op}: {label} hides every key from {padded * heads} of {batch * heads * (seq - 1)} "
        f"query rows (first at batch 0, heads 0, query {first}): {effect}"
    )
    assert found.hint == REAL_HINT.format(reads(style))
    assert_effect(model, effect, (0, 0, first))


# -- the effect follows the fill value and the dtype -------------------------------------------
class Masked(nn.Module):
    """One masking op, with a fill or mask value and a dtype chosen by the test."""

    def __init__(self, how, value, dtype):
        super().__init__()
        self.how, self.value, self.dtype = how, value, dtype

    def forward(self, x, v, keep):
        # Queries and keys of one sequence (x), so query i's own key is key i: a row that sees
        # nothing is a real query's. Two unrelated tensors would not say which key is whose.
        q, k, v = x.to(self.dtype), x.to(self.dtype), v.to(self.dtype)
        if self.how == "sdpa":
            bias = torch.zeros(keep.shape, dtype=self.dtype).masked_fill(~keep, self.value)
            self.out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            self.reference = F.scaled_dot_product_attention(q, k, v)  # unmasked
            return self.out
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.how == "where":
            scores = torch.where(keep, scores, self.value)
        else:
            bias = torch.zeros(keep.shape, dtype=self.dtype).masked_fill(~keep, self.value)
            scores = scores + bias
        self.out = scores.softmax(dim=-1)
        return self.out @ v


def shifted_keep(seq):
    """A causal mask that hides each query's own key: query 0 sees nothing."""
    return torch.ones(seq, seq, dtype=torch.bool).tril(-1)


@pytest.mark.parametrize(
    ("how", "value", "dtype", "effect"),
    [
        # float16 stores -1e9 as -inf: the row is NaN, not uniform.
        ("where", -1e9, torch.float16, NAN),
        # -1e4 in float32 only shifts the row: softmax weighs the hidden keys by score.
        ("add", -1e4, torch.float32, ON_HIDDEN),
        ("add", torch.finfo(torch.bfloat16).min, torch.bfloat16, EVEN),
        # SDPA adds a float16 mask in float32 on CPU: float16's min only shifts the row.
        (
            "sdpa",
            torch.finfo(torch.float16).min,
            torch.float16,
            ON_HIDDEN.replace("softmax", "SDPA"),
        ),
        ("sdpa", float("-inf"), torch.float16, SDPA_ZEROS),
    ],
    ids=["where-1e9-fp16", "add-1e4-fp32", "add-min-bf16", "sdpa-min-fp16", "sdpa-inf-fp16"],
)
def test_effect_follows_the_value_and_dtype(how, value, dtype, effect):
    torch.manual_seed(0)
    x, v = (torch.randn(2, 3, 5, 11) for _ in range(2))
    model = Masked(how, value, dtype)
    found = reported(model, x, v, shifted_keep(5))
    assert found.message.splitlines()[0].endswith(
        f"hides every key from 6 of 30 query rows (first at batch 0, heads 0, query 0): {effect}"
    )
    row = model.out[0, 0, 0].float()
    if effect == NAN:
        assert bool(row.isnan().all())
    elif effect == EVEN:
        assert torch.allclose(row, torch.full_like(row, 0.2), atol=1e-2)
    elif effect == SDPA_ZEROS:
        assert bool((row == 0).all())
    elif how == "sdpa":  # as if unmasked
        assert torch.allclose(row, model.reference[0, 0, 0].float(), atol=1e-2)
    else:  # the unmasked softmax of the scores: not uniform
        assert not torch.allclose(row, torch.full_like(row, 0.2), atol=1e-2)


# -- nn.MultiheadAttention --------------------------------------------------------------------
class Mha(nn.Module):
    """nn.MultiheadAttention with a causal attn_mask and a key_padding_mask, bool or float
    (finfo.min); `shift` hides each query's own key."""

    def __init__(self, heads, d_k, kind="bool", shift=False, need_weights=True):
        super().__init__()
        self.kind, self.shift, self.need_weights = kind, shift, need_weights
        self.attn = nn.MultiheadAttention(heads * d_k, heads, batch_first=True)

    def forward(self, x, attention_mask):
        seq = x.shape[1]
        hide = torch.ones(seq, seq, dtype=torch.bool).triu(0 if self.shift else 1)
        padding = attention_mask == 0
        if self.kind == "float":
            low = torch.finfo(x.dtype).min
            hide = torch.zeros(seq, seq).masked_fill(hide, low)
            padding = torch.zeros(padding.shape).masked_fill(padding, low)
        self.out, self.weights = self.attn(
            x, x, x, key_padding_mask=padding, attn_mask=hide, need_weights=self.need_weights
        )
        return self.out


MHA_CASES = {
    "bool-weights": ("bool", True, "nn.MultiheadAttention returns NaN for them"),
    "bool-no-weights": ("bool", False, "nn.MultiheadAttention returns zeros for them"),
    "float-weights": (
        "float",
        True,
        "nn.MultiheadAttention spreads those rows evenly over every key, hidden ones included",
    ),
}


@sizes
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multihead_attention_left_padded_is_silent(size, case):
    _, heads, _, d_k = size
    kind, need_weights, _ = MHA_CASES[case]
    x, mask = inputs(size)
    model = Mha(heads, d_k, kind, need_weights=need_weights)
    assert fully_masked(findings(model, x, mask)) == []


@sizes
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_multihead_attention_shifted_causal_mask(size, case):
    batch, heads, seq, d_k = size
    kind, need_weights, effect = MHA_CASES[case]
    x, mask = inputs(size)
    model = Mha(heads, d_k, kind, shift=True, need_weights=need_weights)
    found = reported(model, x, mask)
    first = pads(batch, seq)[0]
    assert found.message.splitlines()[0] == (
        f"MultiheadAttention: attn_mask | key_padding_mask hides every key from "
        f"{batch * heads} of {batch * heads * seq} query rows (first at batch 0, heads 0, "
        f"query {first}): {effect}"
    )
    assert found.hint == REAL_HINT.format(READS["mha"])
    out = model.out
    if "NaN" in effect:
        assert bool(out[0, first].isnan().all())
    elif "zeros" in effect:  # zeros from SDPA, then the output projection
        assert torch.equal(out[0, first], model.attn.out_proj.bias)
    else:
        row = model.weights[0, first]
        assert torch.allclose(row, torch.full_like(row, 1 / seq))


# -- transformers models, built from tiny configs -------------------------------------------
def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed (test extra)")


def hf_model(tf, name, size, impl):
    _, heads, seq, d_k = size
    torch.manual_seed(0)
    if name == "gpt2":
        config = tf.GPT2Config(
            vocab_size=100, n_embd=heads * d_k, n_layer=2, n_head=heads, n_positions=max(seq, 16)
        )
        return tf.GPT2LMHeadModel._from_config(config, attn_implementation=impl).eval()
    if name == "llama":
        d_k += d_k % 2  # rotary embeddings need an even head size (11 -> 12: still distinct)
        config = tf.LlamaConfig(
            vocab_size=100,
            hidden_size=heads * d_k,
            head_dim=d_k,
            num_hidden_layers=2,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            intermediate_size=32,
            max_position_embeddings=max(seq, 16),
        )
        return tf.LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()
    config = tf.DebertaV2Config(
        vocab_size=100,
        hidden_size=heads * d_k,
        num_hidden_layers=2,
        num_attention_heads=heads,
        intermediate_size=32,
        relative_attention=True,
        position_buckets=8,
        pos_att_type=["p2c", "c2p"],
        max_position_embeddings=max(seq, 16),
    )
    return tf.DebertaV2Model._from_config(config, attn_implementation=impl).eval()


def token_ids(size):
    batch, _, seq, _ = size
    torch.manual_seed(0)
    return torch.randint(3, 100, (batch, seq))


@sizes
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_transformers_left_padded_decoder_is_silent(size, impl, name):
    tf = _transformers()
    batch, _, seq, _ = size
    model = hf_model(tf, name, size, impl)
    found = findings(model, token_ids(size), attention_mask=left_padded(batch, seq))
    assert fully_masked(found) == [], [f.message for f in found]


@sizes
def test_transformers_deberta_v2_right_padded_is_silent(size):
    tf = _transformers()
    batch, _, seq, _ = size
    model = hf_model(tf, "deberta", size, "eager")
    found = findings(model, token_ids(size), attention_mask=right_padded(batch, seq))
    assert fully_masked(found) == [], [f.message for f in found]


def test_transformers_left_padded_generate_is_silent():
    """Batched generation: a left-padded prompt, then one query per step with a cache."""
    tf = _transformers()
    size = SIZES["distinct"]
    batch, _, seq, _ = size
    model = hf_model(tf, "gpt2", size, "eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with torch.no_grad(), shapeguard.trace(mode="warn") as trace:
            model.generate(
                token_ids(size),
                attention_mask=left_padded(batch, seq),
                max_new_tokens=3,
                do_sample=False,
                pad_token_id=0,
            )
    assert fully_masked(trace.findings) == []
