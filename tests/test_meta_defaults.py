"""A model too large for memory at its defaults (meta-llama's `ModelArgs()`, litgpt's
`Config()`: 4096 wide) is built on the meta device first, counted, and traced there, and
the report says so; a model that fits is built for real as before (issue 30).
"""

import resource
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard

LLAMA_LIKE = """
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.h = n_heads
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.wqkv(x).split(C, 2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.wo(y.transpose(1, 2).reshape(B, T, C))


class Transformer(nn.Module):
    def __init__(self, dim=4096, n_layers=32, n_heads=32, vocab_size=32000):
        super().__init__()
        print("building", dim, n_layers)
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(Attention(dim, n_heads) for _ in range(n_layers))
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(h)
"""
NOTE = (
    "note: traced on the meta device: the model at its defaults needs ~9.6 GB for its "
    "parameters and buffers, more than the 4.0 GB shapeguard builds on cpu unasked; the "
    "checks that read values did not run (pass smaller sizes with --arg to run them)"
)


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    (tmp_path / "llama_like.py").write_text(textwrap.dedent(LLAMA_LIKE))
    monkeypatch.chdir(tmp_path)
    return "llama_like.py"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "400"})


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def test_a_model_too_large_at_its_defaults_is_traced_on_meta_and_says_so(model_file):
    before = peak_rss()
    got = run("trace", model_file)
    assert got.exit_code == 0, (got.stdout, got.stderr)
    assert peak_rss() - before < 2 * 10**9  # 9.6 GB of weights were never allocated
    lines = got.stdout.splitlines()
    assert NOTE in lines
    assert lines[lines.index(NOTE) + 1] == "418 ops in 99 modules; 0 errors, 0 warnings"
    assert "on --device meta there are no values" not in got.stdout
    assert got.stdout.count("building 4096 32") == 1  # the meta build's print is not shown


def test_check_on_it_says_so_and_runs_no_probe(model_file):
    got = run("check", model_file)
    assert got.exit_code == 0, (got.stdout, got.stderr)
    lines = got.stdout.splitlines()
    assert lines[-1] == NOTE
    assert lines[-2] == "2 checks: 1 passed, 1 skipped; passed"


def test_the_json_says_the_device_it_was_traced_on(model_file):
    import json

    got = run("trace", model_file, "--json", "-")
    data = json.loads(got.stdout)
    assert {t["device"] for e in data["events"] for t in e["outputs"]} == {"meta"}


def test_smaller_arguments_build_it_on_cpu_and_probe_it(model_file):
    got = run("check", model_file, "--arg", "dim=64", "--arg", "n_layers=2", "--arg", "n_heads=4")
    assert got.exit_code == 0, (got.stdout, got.stderr)
    assert "meta" not in got.stdout
    assert "causality" in got.stdout and "semantic probes" not in got.stdout
    assert got.stdout.count("building 64 2") == 1


def test_device_meta_asked_for_keeps_its_own_note(model_file):
    got = run("trace", model_file, "--device", "meta")
    assert got.exit_code == 0, (got.stdout, got.stderr)
    assert NOTE not in got.stdout.splitlines()
    assert "note: on --device meta there are no values" in got.stdout
