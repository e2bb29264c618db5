"""`shapeguard.check` on the real-model matrix (`real_models.py`): correct third-party
models fail no probe, and text models skip none for want of knowing their inputs.

A representative subset, to stay within CI's budget: every family, attention
implementation and padding layout at pairwise distinct sizes, the padded layouts at
coincident sizes (batch == seq == head_dim, where roles cannot be read from sizes), and
every batch of one (multi-query models at batch == kv heads): about 320 configurations,
half a minute on one thread. The other "prompt_is_head_dim" and "batch_is_kv_heads"
configurations, which pin naming edge cases of the trace, and the unpadded coincident
ones are left out (all 701 pass: `python tests/real_models.py --check`). Decoder LMs also
run with `use_cache=True` passed explicitly, as `generate()` calls them.

A text model (decoder, encoder, encoder-decoder) has no inconclusive probe: one that does
not run is not applicable (no mask to pad, positional terms for token permutation, not
causal, no cache, a bias per head), with its reason. Head permutation reads every packed and
latent layout from provenance (Falcon's grouped [kv, q + 2, d_k], CodeGen's mp_num
blocks, DeepSeek-V3's MLA), and a batch of one is grown to two for the batch probes.
"""

import functools

import pytest
import real_models
import torch

from shapeguard._probes.check import run_probes

pytestmark = pytest.mark.no_shapeguard


def _batch_of_one(config):
    family = next((f for f in real_models.FAMILIES if f.name == config.family), None)
    return family is not None and family.sizes(config.sizes).batch == 1


CONFIGS = [
    c
    for c in real_models.configs()
    if c.sizes == "distinct"
    or (c.sizes == "coincident" and c.padding != "none")
    or _batch_of_one(c)
]
TEXT = {f.name for f in real_models.FAMILIES if f.kind in ("decoder", "encoder", "encdec")}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _needs_transformers(config):
    if config.id not in real_models.TORCH_IDS:
        pytest.importorskip("transformers", reason="transformers is not installed (test extra)")


@functools.cache
def _check(config, use_cache=False):
    model, args, kwargs = real_models.build(config)
    if use_cache:
        kwargs = {**kwargs, "use_cache": True}
    return run_probes(model, args, kwargs)


def _unexpected_skips(config, report):
    if config.family not in TEXT:
        return []
    return [f"{r.name}: {r.message}" for r in report.inconclusive]


@pytest.mark.parametrize("config", [pytest.param(c, id=c.id) for c in CONFIGS])
def test_check_fails_no_probe_on_a_correct_model(config):
    _needs_transformers(config)
    report = _check(config)
    failed = [f"{r.name}: {r.message}" for r in report.failed]
    assert failed == [], report.render(width=160)
    assert "probes" not in {r.name for r in report.results}
    assert _unexpected_skips(config, report) == [], report.render(width=160)
    assert report.verdict == "passed"


LM_CONFIGS = [
    c
    for c in CONFIGS
    if c.sizes == "distinct"
    and c.family in TEXT
    and c.padding == "left"
    and next(f.kind for f in real_models.FAMILIES if f.name == c.family) == "decoder"
]


@pytest.mark.parametrize("config", [pytest.param(c, id=c.id) for c in LM_CONFIGS])
def test_generate_capable_lms_with_use_cache_decode_consistently(config):
    _needs_transformers(config)
    report = _check(config, use_cache=True)
    assert report.failed == [], report.render(width=160)
    decode = next(r for r in report.results if r.name == "decode consistency")
    assert decode.status == "passed", decode.message
    assert "with its own cache (cache=)" in decode.message
