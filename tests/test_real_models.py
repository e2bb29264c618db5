"""Correct third-party models: zero findings, and outputs untouched by a trace or a guard.

The matrix (tiny transformers models x attention implementation x padding x sizes, and
torch's own attention modules) is in `real_models.py`; `python tests/real_models.py`
prints the same results as a table. Every forward runs in eval mode under no_grad, and
each configuration's forwards run once, cached, whichever tests ask for them.
"""

import functools

import pytest
import real_models
import torch
from real_models import differences

# The plugin would trace every test, so the "plain" forward would not be plain.
pytestmark = pytest.mark.no_shapeguard

CONFIGS = [pytest.param(c, id=c.id) for c in real_models.configs()]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # One thread: stable timing, and no thread-count-dependent reduction order.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _needs_transformers(config):
    if config.id not in real_models.TORCH_IDS:
        pytest.importorskip("transformers", reason="transformers is not installed (test extra)")


@functools.cache
def _plain(config):
    """(model, args, kwargs, first plain output, second plain output)."""
    model, args, kwargs = real_models.build(config)
    first = real_models.forward(model, args, kwargs)
    return model, args, kwargs, first, real_models.forward(model, args, kwargs)


@functools.cache
def _traced(config):
    model, args, kwargs, *_ = _plain(config)
    return real_models.traced_forward(model, args, kwargs)


def _distinct(messages):
    """Each distinct finding once, in full, with how often its first line came (layers)."""
    firsts = [m.splitlines()[0] for m in messages]
    full = dict(zip(firsts, messages, strict=True))
    return "\n".join(f"{firsts.count(first)}x {text}" for first, text in full.items())


@pytest.mark.parametrize("config", CONFIGS)
def test_plain_forward_is_deterministic(config):
    # A check of the harness: without it an output difference could be noise.
    _needs_transformers(config)
    *_, first, second = _plain(config)
    assert differences(first, second) == []


@pytest.mark.parametrize("config", CONFIGS)
def test_trace_finds_nothing(config):
    _needs_transformers(config)
    _, findings, shape_warnings = _traced(config)
    messages = [f"{f.kind}: {f.message}" for f in findings]
    assert messages == [], _distinct(messages)
    assert [str(w.message) for w in shape_warnings] == []


@pytest.mark.parametrize("config", CONFIGS)
def test_trace_leaves_the_output_bit_identical(config):
    _needs_transformers(config)
    *_, plain, _ = _plain(config)
    traced, _, _ = _traced(config)
    assert differences(plain, traced) == []


@pytest.mark.parametrize("config", CONFIGS)
def test_guard_leaves_the_output_bit_identical(config):
    _needs_transformers(config)
    model, args, kwargs, plain, _ = _plain(config)
    guarded, before, during, after = real_models.guarded_forward(model, args, kwargs)
    assert during > before, "guard installed no hook"
    assert after == before, "unguard did not restore the module's hooks"
    assert differences(plain, guarded) == []
