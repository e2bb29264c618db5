"""`shapeguard trace --reach [LAYER]`: the matrices on stdout, the findings' exit status, and
a LAYER that names no site as a usage error that lists the sites."""

import inspect
import textwrap

import pytest
import reach_pictures
from click.testing import CliRunner

from shapeguard._cli.commands import cli

# The file the CLI loads: reach_pictures' causal attention over the keys `keep` marks real,
# two layers of it, and the inputs (example 1 left-padded by two tokens).
MODEL = (
    """
import math

import torch
from torch import nn

D_MODEL = 32


"""
    + inspect.getsource(reach_pictures.Attention)
    + """

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Attention(), Attention()])

    def forward(self, x, keep):
        for layer in self.layers:
            x = x + layer(x, keep)
        return x


def build_model():
    return Model()


def example_inputs():
    keep = torch.ones(3, 9, dtype=torch.bool)
    keep[1, :2] = False  # example 1 is left-padded by two tokens
    return torch.randn(3, 9, 32), keep
"""
)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(MODEL))
    return path


def test_reach_of_one_layer_is_drawn_on_stdout(model):
    result = run("trace", model, "--reach", "layers.1")
    assert result.exit_code == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "model   Model from build_model()"
    assert out[2].startswith("#") and " softmax in layers.1 (model.py:" in out[2]
    assert out[2].endswith("[batch=3, heads=4, seq_q=9, seq_k=9], read from: mask")
    assert out[3] == "  causal + padding: keys 0..1 in example 1"
    assert "  examples 0, 2, every head:" in out and "  example 1, every head:" in out
    assert "    q 4 pp###...." in out
    assert not any("layers.0" in line for line in out)
    assert out[-3].startswith("legend: # seen") and out[-2] == ""
    assert out[-1].endswith("0 errors, 0 warnings")
    assert "┃" not in result.stdout  # the matrices instead of the table
    assert result.stderr == ""


def test_reach_without_a_layer_draws_every_site(model):
    result = run("trace", model, "--reach")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("read from: mask") == 2
    assert result.stderr == ""


def test_a_layer_that_names_no_site_is_a_usage_error_listing_the_sites(model):
    result = run("trace", model, "--reach=decoder")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "shapeguard: error: --reach 'decoder' matches no attention site; the sites: "
        "layers.0, layers.1"
    ]


def test_the_table_has_the_sites_lines_folded(model):
    result = run("trace", model)
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "reach" in line]
    assert len(lines) == 2
    assert lines[0].startswith("reach #") and " softmax in layers.0 (model.py:" in lines[0]
    assert lines[0].endswith("): causal + padding: keys 0..1 in example 1")
    assert lines[1] == (
        "1 reach site not shown: it repeats a site above in another layer (--no-fold shows them)"
    )


def test_a_file_taken_as_the_layer_says_where_reach_goes(model):
    result = run("trace", "--reach", model)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"shapeguard: error: --reach took {model} as its LAYER: put --reach after FILE "
        f"(shapeguard trace {model} --reach), or write --reach=LAYER"
    ]
