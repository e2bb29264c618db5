"""The reach at decode and chunked-prefill steps (`reach_decode`): a cached step's queries
sit among its keys where the keys' concatenation puts them (`_reach/steps.py`), and each
real query must see exactly what the full forward's query at its position sees.

Bugs in three construction styles (a cat cache with a boolean mask, a preallocated buffer
with an additive mask, transformers' DynamicCache with position ids passed down), each at
the three size settings, as a chunk and as a one-token step, found from the trace alone,
with a windowed cache and a left-padded step that sees the padding (`reach_padded_key`);
their fixes, transformers' own `generate` (with and without left padding, eager and
sdpa) and a chunked prefill stay silent.
"""

import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeWarning
from shapeguard._reach import intent as I
from shapeguard._reach import steps

sys.path.insert(0, str(Path(__file__).parent))
import bug_zoo as zoo  # noqa: E402

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.no_shapeguard  # the bugs warn on purpose

SETTING = pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
NEW = pytest.mark.parametrize("new", ["chunk", "one"])  # the step's new tokens: seq, or 1


def _heads(t, B, S, h):
    return t.view(B, S, h, -1).transpose(1, 2)


class CatCache(nn.Module):
    """A causal step over a cache joined with torch.cat, masked with a boolean mask from
    the queries' positions. Bugs: the positions restart at 0 ("restart"), the mask hides
    the new keys ("own"), a query sees the next query's key ("later"), the first cached
    key is hidden ("first")."""

    is_causal = True

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, past_key, past_value):
        B, S, _ = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        past = past_key.size(2)
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        start = 0 if self.bug == "restart" else past
        query_positions = torch.arange(start, start + S)[:, None]
        key_positions = torch.arange(k.size(2))[None, :]
        keep = key_positions <= query_positions + (1 if self.bug == "later" else 0)
        if self.bug == "own":
            keep = keep & (key_positions < past)
        if self.bug == "first":
            keep = keep & (key_positions > 0)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


class BufferCache(nn.Module):
    """A preallocated cache (`[B, h, max, d_k]` buffers, written in place) whose written
    part is read back and joined with the new keys; an additive causal mask
    (`triu(-inf, diagonal=past + 1)`). The bug's diagonal is off by one: each query's own
    key is hidden."""

    is_causal = True

    def __init__(self, d_model, n_heads, batch, max_len, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)
        d_k = d_model // n_heads
        self.register_buffer("k_cache", torch.zeros(batch, n_heads, max_len, d_k))
        self.register_buffer("v_cache", torch.zeros(batch, n_heads, max_len, d_k))

    def forward(self, x, past: int):
        B, S, _ = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        keys = torch.cat([self.k_cache[:, :, :past], k], dim=2)
        values = torch.cat([self.v_cache[:, :, :past], v], dim=2)
        self.k_cache[:, :, past : past + S] = k
        self.v_cache[:, :, past : past + S] = v
        diagonal = past if self.bug else past + 1
        bias = torch.full((S, past + S), float("-inf")).triu(diagonal)  # [S, past + S]
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)


class HFCache(nn.Module):
    """A causal layer that keeps its keys in transformers' DynamicCache (`cache.update`)
    and masks from the `position_ids` its model passes down. The bug passes positions
    that restart at 0 (the default of `arange(seq)` without the cache's length)."""

    is_causal = True

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, cache, position_ids):
        B, S, _ = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        k, v = cache.update(k, v, 0)
        keep = torch.arange(k.size(2))[None, None, :] <= position_ids[:, :, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None])


class HFModel(nn.Module):
    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.bug = bug
        self.layer = HFCache(d_model, n_heads)

    def forward(self, inputs_embeds, cache):
        B, S, _ = inputs_embeds.shape
        past = 0 if self.bug else cache.get_seq_length()
        position_ids = torch.arange(past, past + S)[None].expand(B, -1)
        return self.layer(inputs_embeds, cache, position_ids)


def _new(s, new: str) -> int:
    return s.seq if new == "chunk" else 1


def _past(s, new: str) -> int:
    return s.seq_k - s.seq if new == "chunk" else s.seq_k - 1


def _trace(model, *args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args, mode="warn")


def cat_step(s, new, bug=None):
    torch.manual_seed(0)
    n, past = _new(s, new), _past(s, new)
    cache = torch.randn(2, s.batch, s.heads, past, s.d_k)
    return _trace(CatCache(s.d_model, s.heads, bug), torch.randn(s.batch, n, s.d_model), *cache)


def buffer_step(s, new, bug=None):
    torch.manual_seed(0)
    n, past = _new(s, new), _past(s, new)
    model = BufferCache(s.d_model, s.heads, s.batch, s.seq_k + 8, bug)
    with torch.no_grad():
        model.k_cache[:, :, :past] = torch.randn(s.batch, s.heads, past, s.d_k)
        model.v_cache[:, :, :past] = torch.randn(s.batch, s.heads, past, s.d_k)
    return _trace(model, torch.randn(s.batch, n, s.d_model), past)


def hf_step(s, new, bug=None):
    torch.manual_seed(0)
    n, past = _new(s, new), _past(s, new)
    model = HFModel(s.d_model, s.heads, bug)
    cache = transformers.DynamicCache()
    with torch.no_grad():  # the prompt, outside the trace
        model(torch.randn(s.batch, past, s.d_model), cache)
    return _trace(model, torch.randn(s.batch, n, s.d_model), cache)


def kinds(trace) -> list[str]:
    return [f.kind for f in trace.findings]


def describe(trace) -> str:
    return "\n".join(f"[{f.kind}] {f.message}\n  hint: {f.hint}" for f in trace.findings)


# -- bugs, found from the trace alone ---------------------------------------------------------
CAUSES = {
    "restart": "it does not see its own key: the step's positions restart at 0",
    "own": "it does not see its own key",
    "later": "it sees slots past its own key",  # a chunk's query sees the next one's key
}


@SETTING
@pytest.mark.parametrize(
    ("new", "bug"),
    [
        ("chunk", "restart"),
        ("one", "restart"),
        ("chunk", "own"),
        ("one", "own"),
        ("chunk", "later"),
    ],
)
def test_a_cat_cache_whose_boolean_mask_is_wrong_is_found(sizes, new, bug):
    cause = CAUSES[bug]
    trace = cat_step(sizes, new, bug)
    assert kinds(trace) == ["reach_decode"], describe(trace)
    finding = trace.findings[0]
    past, n = _past(sizes, new), _new(sizes, new)
    assert "real query rows of a cached step do not see the keys the full forward's" in (
        finding.message
    )
    assert f"its own key is {past}, so it should see key {past} and no later one;" in (
        finding.message
    )
    assert f"the keys are {past} cached keys joined with the step's {n} new" in finding.message
    assert "the site is causal: CatCache.is_causal is True" in finding.message
    assert finding.hint.startswith(cause), finding.hint
    assert "cache_position = past + arange(new)" in finding.hint


@SETTING
@NEW
def test_a_full_attention_layer_that_misses_a_cached_key_is_found(sizes, new):
    """Missing earlier keys are judged where the layer states full attention (the config's
    layer_types at its layer_idx); without it they may be an unstated window."""
    model = CatCache(sizes.d_model, sizes.heads, "first")
    torch.manual_seed(0)
    n, past = _new(sizes, new), _past(sizes, new)
    cache = torch.randn(2, sizes.batch, sizes.heads, past, sizes.d_k)
    x = torch.randn(sizes.batch, n, sizes.d_model)
    assert not _trace(model, x, *cache).findings  # no stated layer type: no claim
    model.layer_idx = 0
    model.config = types.SimpleNamespace(layer_types=["full_attention"], sliding_window=4)
    trace = _trace(model, x, *cache)
    assert kinds(trace) == ["reach_decode"], describe(trace)
    message = trace.findings[0].message
    assert (
        f"so it should see keys 0..{past} (config.layer_types[0] is full_attention); it sees "
        f"keys 1..{past}, wrong at key 0)" in message
    )
    assert trace.findings[0].hint.startswith("it misses earlier keys: the mask does not cover")


@SETTING
@NEW
def test_a_buffer_cache_whose_additive_mask_hides_the_new_key_is_found(sizes, new):
    trace = buffer_step(sizes, new, bug=True)
    assert kinds(trace) == ["reach_decode"], describe(trace)
    past = _past(sizes, new)
    message = trace.findings[0].message
    assert f"query 0: its own key is {past}, so it should see key {past} and no later one;" in (
        message
    )
    assert f"it sees keys 0..{past - 1}, wrong at key {past})" in message
    assert trace.findings[0].hint.startswith("it does not see its own key")


@SETTING
@NEW
def test_a_dynamic_cache_given_positions_that_restart_is_found(sizes, new):
    trace = hf_step(sizes, new, bug=True)
    assert kinds(trace) == ["reach_decode"], describe(trace)
    message = trace.findings[0].message
    rows = sizes.batch * sizes.heads * _new(sizes, new)
    assert message.startswith(f"scaled_dot_product_attention over [batch={sizes.batch}, ")
    assert f"{rows} of {rows} real query rows of a cached step" in message
    assert f"it sees key 0, wrong at key {_past(sizes, new)})" in message
    assert trace.findings[0].hint.startswith("it does not see its own key: the step's positions")


class PaddedStep(nn.Module):
    """A causal cat-cache step over a left-padded batch: `attention_mask` covers the cached
    and new tokens (`[B, past + S]`, 1 = real), as transformers documents it with a cache.
    The bug masks causally only: the step's queries see the padding."""

    is_causal = True

    def __init__(self, d_model, n_heads, bug=None):
        super().__init__()
        self.n_heads, self.bug = n_heads, bug
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, inputs_embeds, attention_mask, past_key, past_value):
        B, S, _ = inputs_embeds.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(inputs_embeds).chunk(3, -1))
        past = past_key.size(2)
        k, v = torch.cat([past_key, k], dim=2), torch.cat([past_value, v], dim=2)
        keep = torch.arange(k.size(2))[None, :] <= torch.arange(past, past + S)[:, None]
        keep = keep[None, None]  # [1, 1, S, past + S]
        if not self.bug:
            keep = keep & attention_mask.bool()[:, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def padded_step(s, new, bug=None):
    torch.manual_seed(0)
    n, past = _new(s, new), _past(s, new)
    mask = torch.ones(s.batch, past + n, dtype=torch.long)
    for b in range(s.batch):
        mask[b, : min(b, past)] = 0  # example b is left-padded by b tokens
    cache = torch.randn(2, s.batch, s.heads, past, s.d_k)
    x = torch.randn(s.batch, n, s.d_model)
    return _trace(PaddedStep(s.d_model, s.heads, bug), x, mask, *cache)


@SETTING
@NEW
def test_a_left_padded_step_that_sees_the_padding_is_found(sizes, new):
    """One bug, one finding, and it is `reach_padded_key`, not `reach_decode`: the fix is
    the padding mask on the key axis (its cached columns included), as in the full
    forward; `reach_decode` names the step's positions (invariants.py)."""
    trace = padded_step(sizes, new, bug=True)
    assert kinds(trace) == ["reach_padded_key"], describe(trace)
    message = trace.findings[0].message
    rows = sizes.heads * _new(sizes, new)
    padded_rows = (sizes.batch - 1) * rows  # every example but the first is padded
    assert f"{padded_rows} of {sizes.batch * rows} real query rows see padded keys" in message
    assert "it sees padded key 0); padding from attention_mask (1 = real token), padded on" in (
        message
    )
    assert "hide the padded keys from every query" in trace.findings[0].hint
    assert padded_step(sizes, new).findings == []


# -- their fixes, silent, and judged --------------------------------------------------------
@SETTING
@NEW
@pytest.mark.parametrize("step", [cat_step, buffer_step, hf_step], ids=lambda f: f.__name__)
def test_the_fixed_steps_are_silent(sizes, new, step):
    trace = step(sizes, new)
    assert not trace.findings, describe(trace)
    (reach,) = trace.reach
    assert (reach.seq_q, reach.seq_k) == (_new(sizes, new), sizes.seq_k)


def test_a_step_is_read_from_the_concatenation_not_from_sizes():
    """The same sizes with keys that are no concatenation (handed in whole) establish no
    step: the wrong mask is shown, not judged."""

    class Whole(nn.Module):
        is_causal = True

        def forward(self, q, k, v):
            keep = torch.arange(k.size(2))[None, :] <= torch.arange(q.size(2))[:, None]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)

    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 12, 8), torch.randn(2, 3, 12, 8)
    trace = _trace(Whole(), q, k, v)
    assert not trace.findings and len(trace.reach) == 1


def test_own_at_step_needs_the_queries_part_after_cached_keys():
    from shapeguard._names import dims as D

    queries = D.fresh(5, origin="queries")
    cached = D.fresh(7, origin="cache")
    joined = D.fresh(12, origin="a concatenation")
    joined[0][0].joined = (cached, queries)
    own, evidence = steps.own_at_step(queries, joined, 5, 12)
    assert own == [7, 8, 9, 10, 11]
    assert evidence == "the keys are 7 cached keys joined with the step's 5 new keys (torch.cat)"
    first = D.fresh(12, origin="a concatenation")
    first[0][0].joined = (queries, cached)  # the queries' keys first: no cache before them
    assert steps.own_at_step(queries, first, 5, 12) is None
    assert steps.own_at_step(D.fresh(5), joined, 5, 12) is None  # other queries
    one = D.fresh(8, origin="a concatenation")
    one[0][0].joined = (cached, ())  # a one-token step: its size-1 axis has no atoms
    assert steps.own_at_step((), one, 1, 8)[0] == [7]


# -- transformers' own decoding -------------------------------------------------------------
TEXT = dict(
    vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64, pad_token_id=0,
)  # fmt: skip
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {"sliding_window": 4}),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", {"head_dim": 8, "sliding_window": 4}),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", {}),
}


def build(name: str, impl: str, kv_heads: int = 4):
    model_class, config_class, extra = MODELS[name]
    config = getattr(transformers, config_class)(
        **{**TEXT, "num_key_value_heads": kv_heads}, **extra, attn_implementation=impl
    )
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).eval()


def batch(padded: bool, size=3, seq=9):
    torch.manual_seed(0)
    ids = torch.randint(3, 90, (size, seq))
    mask = torch.ones(size, seq, dtype=torch.long)
    if padded:
        for b in range(size):
            mask[b, : 2 * b] = 0
    return ids, mask


def judged_steps(model, run):
    """(the trace of `run`, the cached steps whose intent was established)."""
    judged = []
    original = I.of_site

    def spy(call, reach):
        found = original(call, reach)
        if found is not None and found.step:
            judged.append(found)
        return found

    I.of_site = spy
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            with shapeguard.trace(mode="warn") as trace:
                run(model)
    finally:
        I.of_site = original
    return trace, judged


@pytest.mark.parametrize(
    ("name", "impl"),
    [
        ("llama", "eager"),
        ("llama", "sdpa"),
        ("mistral", "eager"),
        ("mistral", "sdpa"),
        ("gemma2", "eager"),
        ("qwen2", "eager"),
        ("qwen2", "sdpa"),
    ],
)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left_padded"])
def test_greedy_generate_is_silent(name, impl, padded):
    ids, mask = batch(padded)

    def run(model):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)

    trace, judged = judged_steps(build(name, impl), run)
    assert not trace.findings, describe(trace)
    # Eager decode steps' softmax is not a reach site yet (a one-token query axis carries
    # no tag), and Mistral's cache keeps only the window's last keys: its attention_mask of
    # past + new columns is not its keys, so a padded batch's steps are not judged.
    if impl == "sdpa" and not (name == "mistral" and padded):
        assert judged, "no decode step was judged"
        assert all(s.causal for s in judged)
        if padded:
            assert all(s.padding is not None for s in judged)


def test_a_window_cache_without_a_stated_window_is_judged_as_causal():
    """Mistral states its window in the config only (no evidence, `intent._window`), and its
    cache keeps the window's last keys: a step's keys are those joined with the new one,
    judged as causal (every cached key and its own), and silent."""
    ids, mask = batch(False, seq=9)

    def run(model):
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False)

    trace, judged = judged_steps(build("mistral", "sdpa"), run)
    assert not trace.findings, describe(trace)
    assert judged and {s.own for s in judged} == {(3,)} and not any(s.window for s in judged)


class WindowCache(nn.Module):
    """A windowed layer (`sliding_window = W`) whose cache keeps the last W - 1 keys, as
    transformers' DynamicSlidingWindowLayer does; its mask keeps keys q - W < k <= q in
    the step's positions. The bug's window is one key wider."""

    is_causal = True

    def __init__(self, d_model, n_heads, window, bug=None, stated=True):
        super().__init__()
        self.n_heads, self.window, self.bug = n_heads, window, bug
        if stated:  # the module's own declaration, as Gemma 2's attention makes it
            self.sliding_window = window
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x, past_key, past_value):
        B, S, _ = x.shape
        q, k, v = (_heads(t, B, S, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        kept = self.window - 1
        k = torch.cat([past_key[:, :, -kept:], k], dim=2)
        v = torch.cat([past_value[:, :, -kept:], v], dim=2)
        query_positions = torch.arange(kept, kept + S)[:, None]
        key_positions = torch.arange(k.size(2))[None, :]
        window = self.window + (1 if self.bug else 0)
        keep = (key_positions <= query_positions) & (key_positions > query_positions - window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


@SETTING
@pytest.mark.parametrize("bug", [None, "wider"])
def test_a_windowed_cache_step_is_judged_against_its_window(sizes, bug):
    torch.manual_seed(0)
    window = max(2, sizes.seq // 2)
    past = torch.randn(2, sizes.batch, sizes.heads, sizes.seq_k - sizes.seq, sizes.d_k)
    model = WindowCache(sizes.d_model, sizes.heads, window, bug)
    trace = _trace(model, torch.randn(sizes.batch, sizes.seq, sizes.d_model), *past)
    if bug is None:
        assert not trace.findings, describe(trace)
        return
    assert kinds(trace) == ["reach_decode"], describe(trace)
    message = trace.findings[0].message
    kept = window - 1
    assert f"query 1: its own key is {kept + 1}, so it should see keys 1..{kept + 1} (its" in (
        message
    )
    assert f"window of {window}); it sees keys 0..{kept + 1}, wrong at key 0)" in message
    assert f"; WindowCache.sliding_window = {window}\n" in message


@SETTING
@pytest.mark.parametrize("bug", [None, "wider"])
def test_a_window_the_layer_does_not_state_is_not_judged_as_missing_keys(sizes, bug):
    """Without the module's `sliding_window` (a window in the config only), the earlier
    keys a step's query does not see may be its window: no claim, whatever its size."""
    torch.manual_seed(0)
    window = max(2, sizes.seq // 2)
    past = torch.randn(2, sizes.batch, sizes.heads, sizes.seq_k - sizes.seq, sizes.d_k)
    model = WindowCache(sizes.d_model, sizes.heads, window, bug, stated=False)
    trace = _trace(model, torch.randn(sizes.batch, sizes.seq, sizes.d_model), *past)
    assert not trace.findings, describe(trace)


@pytest.mark.parametrize(
    ("name", "padded", "cached"), [("llama", False, 7), ("llama", True, 7), ("mistral", False, 3)]
)
def test_a_chunked_prefill_is_silent_and_judged(name, padded, cached):
    """A prompt of 7 tokens, then a chunk of 5 with the cache: Mistral's keeps the last 3
    keys (window 4), and its window is not stated by the layer (not judged as missing)."""
    ids, mask = batch(padded, seq=12)
    model = build(name, "sdpa")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :7], attention_mask=mask[:, :7], cache=cache, use_cache=True)

    def run(model):
        model(input_ids=ids[:, 7:], attention_mask=mask, cache=cache, use_cache=True)

    trace, judged = judged_steps(model, run)
    assert not trace.findings, describe(trace)
    assert len(judged) == 2 and all(s.own == tuple(range(cached, cached + 5)) for s in judged)
    if padded:
        (left,) = {s.padding.evidence for s in judged}
        assert left == "attention_mask (1 = real token), padded on the left"
