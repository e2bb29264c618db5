"""The decode-consistency probe: prefill + token-by-token decoding with the module's own
cache gives the outputs of one forward; the five cache bugs of issue 14, each caught
with its step, position and cause, in both attention styles; correct transformers
models (built from configs) pass with their own cache and a StaticCache.
"""

import pytest
import torch
from cached_attention import B, CachedAttention, D, S

from shapeguard._probes.check import check, run_probes

pytestmark = pytest.mark.no_shapeguard

STYLES = ["sdpa", "matmul"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def decode(report):
    return next(r for r in report.results if r.name == "decode consistency")


def probe(bug=None, style="sdpa", **kwargs):
    torch.manual_seed(0)
    return check(CachedAttention(bug, style), torch.randn(B, S, D), **kwargs)


@pytest.mark.parametrize("style", STYLES)
def test_a_correct_cached_attention_passes(style):
    report = probe(style=style, mask=torch.ones(B, S, dtype=torch.long))
    result = decode(report)
    assert result.status == "passed", report.render(width=160)
    assert result.message.startswith(
        "a prefill of 4 tokens then 3 one-token steps with its cache= dict gave the outputs of "
        "one forward over all 7 (deviation "
    )
    assert report.passed, report.render(width=160)


@pytest.mark.parametrize("style", STYLES)
def test_rotary_positions_restarting_at_zero(style):
    result = decode(probe("rope_restart", style))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0].startswith(
        "decode step 1 (the token at position 4) with its cache= dict moved position 4 by "
    )
    assert lines[0].endswith("; the first position that differs is 4")
    assert lines[1].startswith("  likely cause: positions restart at 0 on this step: ")
    assert "cached_attention.py:" in lines[1]
    assert lines[1].endswith(
        "gives the values of position 0, not of position 4 (the cache holds 4 tokens)"
    )
    assert lines[2].startswith("  hint: offset the new tokens' positions by the cache's length")


def test_is_causal_on_a_one_token_step():
    result = decode(probe("is_causal_step"))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0].startswith("decode step 1 (the token at position 4) with its cache= dict moved")
    assert lines[1] == (
        "  likely cause: the trace of this step found causal_alignment: "
        "scaled_dot_product_attention(is_causal=True) with seq_q=1 < seq_k=5: the causal "
        "triangle is aligned top-left, so query i sees keys 0..i only, not the 4 cached keys "
        "before it"
    )
    assert lines[2] == (
        "  hint: on a decode step pass is_causal=False (a single query may see every cached key)"
    )
    assert result.op.startswith("scaled_dot_product_attention at tests/cached_attention.py:")


@pytest.mark.parametrize("style", STYLES)
def test_a_cache_concatenated_on_the_heads_axis(style):
    result = decode(probe("cat_heads", style))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0].startswith(
        "decode step 1 (the token at position 4) with its cache= dict fails: "
    )
    assert lines[1] == (
        "  likely cause: the trace of this step found cache_axis: torch.cat: the cache "
        "cache['k'] grows along heads (axis 1) with k: a cache of keys or values grows along "
        "the sequence, axis 2, one position per new token"
    )
    assert lines[2] == "  hint: concatenate the cached keys and values along the sequence axis"


@pytest.mark.parametrize("style", STYLES)
def test_a_square_causal_mask_against_cached_and_new_keys(style):
    # One-token steps broadcast the [1, 1] mask, so the outputs agree: the trace of the
    # step finds it.
    result = decode(probe("square_mask", style))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0] == (
        "decode step 1 (the token at position 4) with its cache= dict: the trace of the step "
        "found a shape bug in the cache's use"
    )
    op = "scaled_dot_product_attention: attn_mask" if style == "sdpa" else "masked_fill: ~keep"
    assert lines[1] == (
        f"  likely cause: the trace of this step found mask_cache_length: {op} [1, 1] is square "
        "over the 1 new token, but the scores have 5 keys (4 cached + 1 new): it fits only "
        "because it broadcasts, and hides nothing of the cache"
    )
    assert lines[2].startswith("  hint: build each step's mask over cached + new keys")


@pytest.mark.parametrize("style", STYLES)
def test_a_padding_mask_not_extended_by_the_new_tokens(style):
    result = decode(probe("stale_mask", style, mask=torch.ones(B, S, dtype=torch.long)))
    assert result.status == "failed"
    lines = result.message.splitlines()
    assert lines[0].startswith(
        "decode step 1 (the token at position 4) with its cache= dict fails: "
    )
    if style == "matmul":  # masked_fill: the rule sees the mask against the scores
        assert lines[1] == (
            "  likely cause: the trace of this step found mask_cache_length: masked_fill: "
            "mask[:, None, None, :] == 0 [2, 1, 1, 4] covers the 4 cached keys but not the 1 new "
            "token: the scores have 5 keys (4 cached + 1 new)"
        )
    else:  # `keep & mask` fails first: the sizes say what was not extended
        assert lines[1] == (
            "  likely cause: a tensor as long as the cache before this step (4) meets one as long "
            "as cached + new (5): something kept from an earlier step (a padding mask, "
            "positions) was not extended by the new token"
        )
    assert lines[2].startswith("  hint: build each step's mask over cached + new keys")


def test_a_module_without_a_cache_is_not_applicable():
    from cached_attention import rotate  # noqa: F401  (the module is importable alone)

    class NoCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = CachedAttention()

        def forward(self, x):
            return self.inner(x)

    result = decode(check(NoCache(), torch.randn(B, S, D)))
    assert result.status == "skipped" and not result.applicable
    assert result.message.startswith("the module keeps no cache (no cache or past_key_values")


def test_the_decode_probe_leaves_the_cache_and_module_untouched():
    model = CachedAttention()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = check(model, torch.randn(B, S, D))
    assert decode(report).status == "passed"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# -- transformers models built from configs ---------------------------------------------------
HF = ["llama", "mistral", "qwen2", "gpt2", "falcon", "t5"]


@pytest.mark.parametrize("family", HF)
@pytest.mark.parametrize("padding", ["none", "left"])
def test_transformers_models_decode_as_they_run_whole(family, padding):
    pytest.importorskip("transformers")
    import real_models

    kind = next(f.kind for f in real_models.FAMILIES if f.name == family)
    if kind == "encdec" and padding == "left":
        padding = "right"  # encoder-decoders pad their source on the right
    config = next(
        c
        for c in real_models.configs()
        if c.family == family and c.padding == padding and c.sizes == "distinct"
    )
    model, args, kwargs = real_models.build(config)
    report = run_probes(model, args, kwargs)
    result = decode(report)
    assert result.status == "passed", report.render(width=160)
    assert "with its own cache (cache=)" in result.message
    if kind == "decoder":
        assert "and with a StaticCache" in result.message
    assert report.passed, report.render(width=160)
