"""The reach against the intent that can be established: each invariant's bug found from
the trace alone in several construction styles at the three size settings, and the
correct counterparts silent (left padding, windows, packed documents, prefixes, sinks,
image spans). `invariants.check` is tested on reaches built by hand too, where the
intent is given and the construction cannot hide anything."""

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning, _ops, checks
from shapeguard._reach import intent as I
from shapeguard._reach import invariants as V
from shapeguard._reach.rows import Reach, runs_where
from shapeguard.attention import flash_attention

sys.path.insert(0, str(Path(__file__).parent))
import bug_zoo as zoo  # noqa: E402

pytestmark = pytest.mark.no_shapeguard

SETTINGS = zoo.SETTINGS
VOCAB = 50
NEG = torch.finfo(torch.float32).min


# -- the reach judged against a given intent ------------------------------------------------
def site(**given) -> I.SiteIntent:
    seq = given.pop("seq")
    facts = dict(
        own=tuple(range(seq)),
        padding=None,
        causal="Attention.is_causal is True",
        bidirectional="",
        window=None,
        window_evidence="",
        full="",
        documents=None,
        documents_evidence="",
        layer=None,
    )
    facts.update(given)
    padding = facts["padding"]
    if padding is not None and "batch_axis" not in given:
        facts["batch_axis"] = padding.batch_axis
    return I.SiteIntent(**facts)


def left_padding(sizes) -> list[list[bool]]:
    """Padding per example: example i has i * (seq - 1) // batch pads on the left."""
    pads = [i * (sizes.seq - 1) // sizes.batch for i in range(sizes.batch)]
    return [[j < p for j in range(sizes.seq)] for p in pads]


def padding_of(pads) -> I.Padding:
    rows = tuple(tuple(r) for r in pads)
    return I.Padding(rows, None, "attention_mask (1 = real token)", 0)


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
def test_a_causal_mask_that_ignores_left_padding_lets_real_queries_see_padding(sizes):
    pads = left_padding(sizes)
    reach = Reach.from_visible(causal(sizes.seq), lead=(sizes.batch, sizes.heads))
    found, total = V.check(reach, site(seq=sizes.seq, padding=padding_of(pads)))
    assert found is not None and found.kind == "reach_padded_key"
    b = next(i for i, row in enumerate(pads) if any(row))
    first = pads[b].index(False)
    assert found.first == ((b, 0), first, ((0, first),))
    real = sum(row.count(False) for row in pads)
    assert total == real * sizes.heads  # rows of every head, each head stored once
    keep = causal(sizes.seq) & ~torch.tensor(pads)[:, None, None, :]
    right = Reach.from_visible(keep, lead=(sizes.batch, sizes.heads))
    assert V.check(right, site(seq=sizes.seq, padding=padding_of(pads)))[0] is None


@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("style", ["keep_triu", "hide_tril", "additive_shift"])
def test_a_causal_site_that_sees_later_positions(sizes, style):
    n = sizes.seq
    if style == "keep_triu":  # the triangle's polarity flipped: True meant hide
        visible = torch.ones(n, n, dtype=torch.bool).triu()
    elif style == "hide_tril":  # hides the past and keeps the future
        visible = ~torch.ones(n, n, dtype=torch.bool).tril(-1)
    else:  # an additive mask one diagonal off: each query sees the next token
        visible = torch.full((n, n), NEG).triu(2) > NEG / 2
    reach = Reach.from_visible(visible, lead=(sizes.batch, sizes.heads))
    found, _ = V.check(reach, site(seq=n))
    assert found is not None and found.kind == "reach_future"
    assert V.check(Reach.from_visible(causal(n)), site(seq=n))[0] is None
    # Where the module states nothing, or opens spans on purpose: no claim.
    assert V.check(reach, site(seq=n, causal=""))[0] is None
    stated = site(seq=n, bidirectional="the model takes token_type_ids")
    assert V.check(reach, stated)[0] is None or style == "keep_triu" and n == 1


def window_mask(n: int, w: int) -> torch.Tensor:
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (k <= q) & (k > q - w)


@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
def test_a_window_one_too_wide_or_missing_is_found_and_the_window_itself_is_silent(sizes):
    n = sizes.seq
    w = max(2, n // 3)
    facts = site(seq=n, window=w, window_evidence=f"Attention.sliding_window = {w}")
    assert V.check(Reach.from_visible(window_mask(n, w)), facts)[0] is None
    for wrong in (window_mask(n, w + 1), causal(n), window_mask(n, w - 1)):
        found, _ = V.check(Reach.from_visible(wrong), facts)
        assert found is not None and found.kind == "reach_window", wrong.int()
    full = site(seq=n, full="config.layer_types[1] is full_attention")
    assert V.check(Reach.from_visible(causal(n)), full)[0] is None
    assert V.check(Reach.from_visible(window_mask(n, w)), full)[0].kind == "reach_window"


@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
def test_attention_sinks_beside_a_window_are_not_outside_it(sizes):
    n, sinks = sizes.seq, 1
    w = max(2, n // 3)
    visible = window_mask(n, w)
    visible[:, :sinks] = True
    visible &= causal(n)
    facts = site(seq=n, window=w, window_evidence="w")
    found, _ = V.check(Reach.from_visible(visible), facts)
    # With the sink the far keys but one are outside every window: a sink, not a bug. Where
    # every far key is one (a sequence one longer than the window), nothing tells them apart.
    assert found is None or n - w <= sinks


@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("style", ["causal_only", "shifted_ids", "bidirectional_blocks"])
def test_packed_documents_that_see_each_other(sizes, style):
    n = sizes.seq
    cut = max(1, n // 2)
    docs = tuple(0 if j < cut else 1 for j in range(n))
    d = torch.tensor(docs)
    if style == "causal_only":
        visible = causal(n)
    elif style == "shifted_ids":  # document ids read one position late
        shifted = torch.cat([d[:1], d[:-1]])
        visible = causal(n) & (shifted[:, None] == shifted[None, :])
    else:  # document blocks without the triangle and across the boundary by one
        visible = causal(n) | (torch.arange(n)[None, :] <= cut)
    facts = site(seq=n, documents=(docs,), documents_evidence="position_ids that restart")
    found, _ = V.check(Reach.from_visible(visible), facts)
    assert found is not None and found.kind in ("reach_documents", "reach_future")
    right = causal(n) & (d[:, None] == d[None, :])
    assert V.check(Reach.from_visible(right), facts)[0] is None


def test_a_real_query_left_with_no_key_where_the_mask_alone_calls_it_padding():
    """Example 0 has no padding, but its first two keys are hidden from every query (the
    mask of example 1, left padded by two): mask_fully_masked reads those queries as
    padding; the attention_mask says they are real."""
    n = 7
    pads = [[False] * n, [True, True] + [False] * (n - 2)]
    keep = causal(n) & ~torch.tensor(pads[1])[None, :]
    reach = Reach.from_visible(keep[None].expand(2, n, n), lead=(2,))
    found, total = V.check(reach, site(seq=n, padding=padding_of(pads)))
    assert found is not None and found.kind == "reach_no_key"
    assert found.first == ((0,), 0, ()) and found.rows == 2 and total == 2 * n - 2


def test_the_message_names_the_relation_the_place_and_the_fix():
    n = 5
    pads = [[False] * n, [True, True, False, False, False]]
    reach = Reach.from_visible(
        causal(n), lead=(2, 3), lead_axes=("batch", "heads"), op="softmax", module="attn"
    )
    facts = site(seq=n, padding=I.Padding(tuple(map(tuple, pads)), None, "attention_mask", 0))
    found, total = V.check(reach, facts)
    v = V._violation(_NoOperands(), reach, facts, found, total)
    assert v.kind == "reach_padded_key" and v.severity == "warning"
    assert v.relation == (
        "softmax over [batch=2, heads=3, seq_q=5, seq_k=5]: 9 of 24 real query rows see padded "
        "keys (first at batch 1, heads 0, query 2: it sees padded keys 0..1); padding from "
        "attention_mask"
    )
    assert v.hint.startswith("hide the padded keys from every query")


class _NoOperands:
    op = "softmax"
    spec = _ops.by_name("softmax")

    def bound(self):
        return {}


# -- intent read from the root's inputs ------------------------------------------------------
def test_documents_restart_where_position_ids_return_to_zero_not_in_left_padding():
    assert I._restarts([0, 1, 2, 0, 1, 0]) == (0, 0, 0, 1, 1, 2)
    assert I._restarts([0, 0, 0, 1, 2]) == (0, 0, 0, 0, 0)
    # transformers' left padding fills pads with 1: one restart, at the first real token
    assert I._restarts([1, 1, 0, 1, 2]) == (0, 0, 1, 1, 1)


def test_padding_values_are_read_only_from_a_mask_of_zeros_and_ones():
    assert I._padding_values([[1, 1, 0]]) == [[True, True, False]]
    assert I._padding_values([[True, False]]) == [[True, False]]
    assert I._padding_values([[0.0, -1e9]]) is None
    assert runs_where([True, True, False, True]) == ((0, 2), (3, 4))
    assert I.runs_of_keys([0, 1, 3]) == ((0, 2), (3, 4))


# -- from the trace alone --------------------------------------------------------------------
# The sites' recording (s37-sites) registers the reach kinds on the rules that call `judge`;
# until it is merged nothing calls it from a trace.
recorded = pytest.mark.skipif(
    "reach_padded_key" not in checks.kinds(),
    reason="no attention site records its reach yet",
)


def findings(model, *args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        trace = shapeguard.trace(model, *args, mode="warn")
    return [f for f in trace.findings if f.kind.startswith("reach_")]


def describe(found) -> str:
    return "\n".join(f"[{f.kind}] {f.message}\n  hint: {f.hint}" for f in found)


class Attention(nn.Module):
    """Self-attention over `[batch, seq, d_model]` whose mask `style` builds: the styles
    below are the ways users write it, right and wrong."""

    is_causal = True

    def __init__(self, sizes, style: str, sliding_window: int | None = None) -> None:
        super().__init__()
        self.h, self.d_k = sizes.heads, sizes.d_k
        d_model = sizes.heads * sizes.d_k
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.style = style
        self.sliding_window = sliding_window

    def forward(self, x, attention_mask, position_ids):
        B, S, _ = x.shape
        q = self.w_q(x).view(B, S, self.h, self.d_k).transpose(1, 2)
        k = self.w_k(x).view(B, S, self.h, self.d_k).transpose(1, 2)
        v = self.w_v(x).view(B, S, self.h, self.d_k).transpose(1, 2)
        if self.style.startswith("sdpa"):
            keep = STYLES[self.style](S, attention_mask, position_ids, self.sliding_window)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
            scores = STYLES[self.style](scores, attention_mask, position_ids, self.sliding_window)
            out = scores.softmax(dim=-1) @ v
        return out.transpose(1, 2).reshape(B, S, self.h * self.d_k)


class Decoder(nn.Module):
    def __init__(self, sizes, style: str, sliding_window: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, sizes.heads * sizes.d_k)
        self.attn = Attention(sizes, style, sliding_window)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.attn(self.embed(input_ids), attention_mask, position_ids)


def _tril(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


# Each style: (scores or S, attention_mask, position_ids, window) -> masked scores or SDPA mask.
def padded_causal_fill(scores, am, pos, w):
    hide = ~_tril(scores.shape[-1]) | (am[:, None, None, :] == 0)
    return scores.masked_fill(hide, float("-inf"))


def padded_causal_additive(scores, am, pos, w):
    causal_bias = torch.full(scores.shape[-2:], NEG).triu(1)
    return scores + causal_bias + (1.0 - am[:, None, None, :].float()) * NEG


def sdpa_padded_causal(S, am, pos, w):
    return _tril(S) & am.bool()[:, None, None, :]


def causal_only_fill(scores, am, pos, w):  # bug: the padding is never applied
    return scores.masked_fill(~_tril(scores.shape[-1]), float("-inf"))


def padding_of_another_example_additive(scores, am, pos, w):  # bug: examples' rows reversed
    causal_bias = torch.full(scores.shape[-2:], NEG).triu(1)
    return scores + causal_bias + (1.0 - am.flip(0)[:, None, None, :].float()) * NEG


def sdpa_lengths_off_by_one(S, am, pos, w):  # bug: left padding, keeps one padded key
    lengths = am.sum(-1)
    return _tril(S) & (torch.arange(S)[None, :] >= S - lengths[:, None] - 1)[:, None, None, :]


def future_shifted_additive(scores, am, pos, w):  # bug: triu(2), each query sees the next
    return scores + torch.full(scores.shape[-2:], NEG).triu(2)


def future_from_positions(scores, am, pos, w):  # bug: `<= q + 1` where `<= q` was meant
    keep = pos[:, None, None, :] <= pos[:, None, :, None] + 1
    return scores.masked_fill(~keep, NEG)


def sdpa_future_shift(S, am, pos, w):  # bug: one diagonal too many
    return torch.ones(S, S, dtype=torch.bool).tril(1)


def window_fill(scores, am, pos, w):
    n = scores.shape[-1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return scores.masked_fill(~((k <= q) & (k > q - w)), float("-inf"))


def window_with_sinks(scores, am, pos, w):  # StreamingLLM: the first key stays in view
    n = scores.shape[-1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (k <= q) & ((k > q - w) | (k == 0))
    return scores.masked_fill(~keep, float("-inf"))


def window_too_wide_additive(scores, am, pos, w):  # bug: kv >= q - w keeps w + 1 keys
    n = scores.shape[-1]
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return scores + torch.where((k <= q) & (k >= q - w), 0.0, NEG)


def sdpa_window_missing(S, am, pos, w):  # bug: the windowed layer gets the full mask
    return _tril(S)


def documents_fill(scores, am, pos, w):
    doc = (pos == 0).cumsum(-1)
    same = doc[:, None, :, None] == doc[:, None, None, :]
    return scores.masked_fill(~(same & _tril(scores.shape[-1])), float("-inf"))


def documents_ignored_additive(scores, am, pos, w):  # bug: packed, masked as one sequence
    return scores + torch.full(scores.shape[-2:], NEG).triu(1)


def sdpa_documents_from_cumsum_off_by_one(S, am, pos, w):  # bug: the boundary token leaks
    doc = (pos == 0).cumsum(-1) - (pos == 0).long()  # each restart still in the old document
    return (doc[:, None, :, None] == doc[:, None, None, :]) & _tril(S)


STYLES = {f.__name__: f for f in (
    padded_causal_fill, padded_causal_additive, sdpa_padded_causal, causal_only_fill,
    padding_of_another_example_additive, sdpa_lengths_off_by_one, future_shifted_additive,
    future_from_positions, sdpa_future_shift, window_fill, window_too_wide_additive,
    sdpa_window_missing, window_with_sinks, documents_fill, documents_ignored_additive,
    sdpa_documents_from_cumsum_off_by_one,
)}  # fmt: skip


def inputs(sizes, padding: str = "right", packed: bool = False):
    torch.manual_seed(0)
    ids = torch.randint(1, VOCAB, (sizes.batch, sizes.seq))
    if padding == "right":
        am = zoo.attention_mask(sizes)
    elif padding == "left":
        am = zoo.attention_mask(sizes).flip(-1)
    else:
        am = torch.ones(sizes.batch, sizes.seq, dtype=torch.long)
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    if packed:
        cut = max(1, sizes.seq // 2)
        pos = torch.cat([torch.arange(cut), torch.arange(sizes.seq - cut)]).expand(sizes.batch, -1)
    return ids, am, pos


BUGS = [
    ("reach_padded_key", "causal_only_fill", "left"),
    ("reach_padded_key", "padding_of_another_example_additive", "left"),
    ("reach_padded_key", "sdpa_lengths_off_by_one", "left"),
    ("reach_future", "future_shifted_additive", "none"),
    ("reach_future", "future_from_positions", "none"),
    ("reach_future", "sdpa_future_shift", "none"),
    ("reach_window", "window_too_wide_additive", "none"),
    ("reach_window", "sdpa_window_missing", "none"),
    ("reach_documents", "documents_ignored_additive", "packed"),
    ("reach_documents", "sdpa_documents_from_cumsum_off_by_one", "packed"),
]
RIGHT = [
    ("padded_causal_fill", "right"),
    ("padded_causal_fill", "left"),
    ("padded_causal_additive", "left"),
    ("sdpa_padded_causal", "right"),
    ("window_fill", "none"),
    ("window_with_sinks", "none"),
    ("documents_fill", "packed"),
]


def _window(style, sizes):
    return max(2, sizes.seq // 3) if "window" in style else None


def _run(style, padding, sizes):
    model = Decoder(sizes, style, _window(style, sizes)).eval()
    ids, am, pos = inputs(sizes, padding if padding != "packed" else "none", padding == "packed")
    return findings(model, ids, am, pos)


@recorded
@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize(("kind", "style", "padding"), BUGS, ids=[b[1] for b in BUGS])
def test_each_invariant_bug_is_found_from_the_trace_alone(kind, style, padding, sizes):
    found = _run(style, padding, sizes)
    if kind == "reach_window" and sizes.seq <= _window(style, sizes) + 1:
        pytest.skip("a window as long as the sequence cannot be told from full attention")
    assert [f.kind for f in found] == [kind], describe(found)


@recorded
@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize(("style", "padding"), RIGHT, ids=[f"{s}-{p}" for s, p in RIGHT])
def test_correct_masks_stay_silent(style, padding, sizes):
    found = _run(style, padding, sizes)
    assert not found, describe(found)


# -- transformers models: the correct counterparts, from the trace alone ----------------------
transformers = pytest.importorskip("transformers")

TEXT = dict(
    vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
)  # fmt: skip


def hf_trace(model, generate=False, **inputs):
    """The trace of one forward (or a short greedy generate) in warn mode."""
    model.eval()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        with shapeguard.trace(mode="warn") as trace:
            if generate:
                model.generate(**inputs, max_new_tokens=3, do_sample=False)
            else:
                model(**inputs)
    return trace


def left_padded_batch(batch=3, seq=12):
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    for b in range(batch):
        mask[b, : 2 * b] = 0
    return ids, mask


def judged_padding(trace) -> bool:
    """Whether some site was judged against an established padding (not silent by default)."""
    return any(any(r.padding) for r in trace.reach)


@recorded
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_left_padded_decoding_with_a_cache_is_silent(impl):
    ids, mask = left_padded_batch()
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**TEXT, attn_implementation=impl)
    )
    trace = hf_trace(model, generate=True, input_ids=ids, attention_mask=mask)
    assert not trace.findings, describe(trace.findings)
    assert judged_padding(trace)


@recorded
def test_sliding_windows_and_full_layers_with_padding_and_a_cache_are_silent():
    ids, mask = left_padded_batch()
    config = transformers.Gemma2Config(
        **TEXT, head_dim=8, sliding_window=4, attn_implementation="eager"
    )
    model = transformers.Gemma2ForCausalLM(config)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    trace = hf_trace(model, generate=True, input_ids=ids, attention_mask=mask)
    assert not trace.findings, describe(trace.findings)
    windowed = [r for r in trace.reach if r.module.endswith("layers.0.self_attn")]
    assert any(r.seq_k == 12 and r.summary().endswith("(4 of 12)") for r in windowed)


@recorded
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_full_layer_that_carries_the_configs_window_size_is_not_held_to_it(impl):
    """Exaone 4 sets `sliding_window` on every layer and windows only where `is_sliding`
    (its config's layer_types): the full layer is not a windowed one (world corpus)."""
    ids, mask = left_padded_batch()
    config = transformers.Exaone4Config(
        **TEXT, sliding_window=4, sliding_window_pattern=2, attn_implementation=impl
    )
    model = transformers.Exaone4ForCausalLM(config)
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert model.model.layers[1].self_attn.sliding_window == 4  # the size, on the full layer
    trace = hf_trace(model, generate=True, input_ids=ids, attention_mask=mask)
    assert not trace.findings, describe(trace.findings)
    windowed = [r for r in trace.reach if r.module.endswith("layers.0.self_attn")]
    full = [r for r in trace.reach if r.module.endswith("layers.1.self_attn")]
    assert any(r.seq_k == 12 and r.summary().endswith("(4 of 12)") for r in windowed)
    assert any(r.seq_k == 12 and r.summary().endswith("(12 of 12)") for r in full)


@recorded
def test_cross_attention_over_an_encoders_padding_is_silent():
    ids, mask = left_padded_batch()
    config = transformers.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.BartForConditionalGeneration(config)
    trace = hf_trace(
        model, input_ids=ids, attention_mask=mask.flip(-1), decoder_input_ids=ids[:, :5]
    )
    assert not trace.findings, describe(trace.findings)
    cross = [r for r in trace.reach if "encoder_attn" in r.module]
    assert cross and any(cross[0].padding)


@recorded
def test_a_bidirectional_encoder_is_silent_and_its_padding_judged():
    ids, mask = left_padded_batch()
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
        intermediate_size=64, attn_implementation="eager",
    )  # fmt: skip
    trace = hf_trace(transformers.BertModel(config), input_ids=ids, attention_mask=mask.flip(-1))
    assert not trace.findings, describe(trace.findings)
    assert judged_padding(trace)


@recorded
def test_packed_documents_without_a_cache_are_silent_and_with_one_they_mix():
    """transformers reads packed position ids only without a cache: with the cache on, the
    packed row is masked as one sequence, and its documents see each other."""
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (1, 12))
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**TEXT, attn_implementation="sdpa")
    )
    quiet = hf_trace(model, input_ids=ids, position_ids=positions, use_cache=False)
    assert not quiet.findings, describe(quiet.findings)
    mixed = hf_trace(model, input_ids=ids, position_ids=positions)
    assert {f.kind for f in mixed.findings} == {"reach_documents"}, describe(mixed.findings)
    assert "documents from position_ids that restart at 0 within a row" in mixed.findings[0].message


@recorded
def test_image_tokens_that_see_each_other_inside_a_causal_decoder_are_silent():
    """Gemma 3: the image's tokens attend to each other both ways; the text stays causal."""
    text = dict(
        **TEXT, head_dim=8, sliding_window=4, layer_types=["sliding_attention", "full_attention"]
    )
    text["vocab_size"] = 300
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        image_size=48, patch_size=8,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=9,
        image_token_index=299, boi_token_index=297, eoi_token_index=298,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config)
    ids = torch.randint(1, 290, (2, 16))
    ids[:, 2], ids[:, 3:12], ids[:, 12] = 297, 299, 298
    trace = hf_trace(
        model, input_ids=ids, pixel_values=torch.randn(2, 3, 48, 48),
        token_type_ids=(ids == 299).long(), attention_mask=torch.ones(2, 16, dtype=torch.long),
    )  # fmt: skip
    assert not trace.findings, describe(trace.findings)
    full = [r for r in trace.reach if r.module.endswith("language_model.layers.1.self_attn")]
    assert full and full[0].row((0,) * len(full[0].lead), 3) == ((0, 12),)  # the image, both ways


class TorchStyleEncoder(nn.Module):
    """Self-attention that takes torch's `key_padding_mask` (True = padding)."""

    def __init__(self, d_model=32, bug=False):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)
        self.bug = bug

    def forward(self, x, key_padding_mask):
        h = self.proj(x)
        scores = h @ h.transpose(-2, -1)  # [batch, seq_q, seq_k]
        hide = key_padding_mask[:, None, :]
        if self.bug:
            hide = hide.flip(0)  # another example's padding
        return scores.masked_fill(hide, float("-inf")).softmax(dim=-1) @ h


@recorded
@pytest.mark.parametrize("sizes", SETTINGS, ids=lambda s: s.name)
def test_torchs_key_padding_mask_is_padding_where_true(sizes):
    torch.manual_seed(0)
    x = torch.randn(sizes.batch, sizes.seq, 32)
    padding = zoo.attention_mask(sizes) == 0  # right padding, True at the pads
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        right = shapeguard.trace(TorchStyleEncoder(), x, padding, mode="warn")
        wrong = shapeguard.trace(TorchStyleEncoder(bug=True), x, padding, mode="warn")
    assert not right.findings, describe(right.findings)
    assert any(any(r.padding) for r in right.reach)
    kinds = [f.kind for f in wrong.findings]
    assert kinds == ["reach_padded_key"], describe(wrong.findings)
    assert "key_padding_mask (True = padding)" in wrong.findings[0].message


class FlashWindow(nn.Module):
    """A windowed causal layer through shapeguard.attention's flash_attention (SDPA off
    the GPU): flash-attn's window_size=(W - 1, 0) keeps W keys, its own included."""

    is_causal = True
    sliding_window = 3

    def __init__(self, d_model=32, n_heads=4, left=2):
        super().__init__()
        self.n_heads, self.left = n_heads, left
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, inputs_embeds):
        B, S, _ = inputs_embeds.shape
        q, k, v = (t.view(B, S, self.n_heads, -1) for t in self.qkv(inputs_embeds).chunk(3, -1))
        return flash_attention(q, k, v, causal=True, window_size=(self.left, 0), backend="sdpa")


@recorded
def test_a_flash_window_is_judged_against_the_modules_window():
    x = torch.randn(2, 9, 32)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        right = shapeguard.trace(FlashWindow(), x, mode="warn")
        wrong = shapeguard.trace(FlashWindow(left=3), x, mode="warn")
    assert not right.findings, describe(right.findings)
    assert [f.kind for f in wrong.findings] == ["reach_window"], describe(wrong.findings)
