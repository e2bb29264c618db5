"""What shapeguard reads of the user's source is cached per code location, parsed one
function at a time, and read again when the file changes on disk."""

import importlib.util
import os
import textwrap
import warnings

import pytest
import torch

import shapeguard
from shapeguard import _source

pytestmark = pytest.mark.no_shapeguard

MODULE = """
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 12)

    def forward(self, x):
        {name} = self.proj(x)
        return {name}.softmax(dim=-1)
"""


def _load(path, name: str, stamp: int):
    path.write_text(textwrap.dedent(MODULE.format(name=name)))
    os.utime(path, ns=(stamp, stamp))  # two writes within a clock tick still differ
    spec = importlib.util.spec_from_file_location(f"edited_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Attention()


def _labels(model):
    trace = shapeguard.trace(model, torch.randn(2, 3, 12))
    return [e.outputs[0].label for e in trace.events]


def test_a_file_edited_between_two_traces_is_read_again(tmp_path):
    path = tmp_path / "edited_model.py"
    assert _labels(_load(path, "scores", 1_000_000_000)) == ["scores", "output"]
    # The same file, other names on the same lines: the cached sites must not be reused.
    assert _labels(_load(path, "logits", 2_000_000_000)) == ["logits", "output"]


def test_a_site_parses_its_function_not_the_file(tmp_path):
    path = tmp_path / "big_model.py"
    filler = "".join(f"def unused_{i}(x):\n    return x + {i}\n\n\n" for i in range(300))
    path.write_text(filler + textwrap.dedent(MODULE.format(name="hidden")))
    spec = importlib.util.spec_from_file_location("big_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _labels(module.Attention()) == ["hidden", "output"]
    parsed = [key for key in _source._trees if key[0] == str(path)]
    assert parsed and all(first > 0 for _, first in parsed)  # functions, never the file
    tree = _source._trees[parsed[0]][1]
    assert len(tree.body) == 1  # one function (under its dummy class header)


def test_module_level_code_still_parses_the_file(tmp_path):
    path = tmp_path / "script.py"
    path.write_text("import torch\nx = torch.ones(2, 3)\nscores = x @ x.T\n")
    with shapeguard.trace() as trace:
        namespace = {"__name__": "script"}
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    assert [e.outputs[0].label for e in trace.events][-1] == "scores"


VIEW_MODULE = """
import torch
from torch import nn


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_heads, self.d_k = 4, 4
        self.proj = nn.Linear(16, 16)

    def forward(self, x):
        B, S, _ = x.shape
        t = self.proj(x)
        return t.view({sizes})
"""


def _view_kinds(path, sizes: str, stamp: int) -> list[str]:
    path.write_text(textwrap.dedent(VIEW_MODULE.format(sizes=sizes)))
    os.utime(path, ns=(stamp, stamp))
    spec = importlib.util.spec_from_file_location(f"edited_view_{stamp}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shapeguard.ShapeWarning)
        trace = shapeguard.trace(module.Heads(), torch.randn(2, 4, 16), mode="warn")
    return [f.kind for f in trace.findings]


def test_what_a_view_names_its_sizes_is_read_again_after_an_edit(tmp_path):
    # seq == heads == 4: only the user's names tell the heads carved out of the sequence
    # (the names are read once per site; an edited line is a new site).
    path = tmp_path / "edited_view.py"
    assert _view_kinds(path, "B, self.n_heads, S, self.d_k", 1_000_000_000) == ["view_mixes_axes"]
    assert _view_kinds(path, "B, S, self.n_heads, self.d_k", 2_000_000_000) == []
    assert _view_kinds(path, "B, self.n_heads, S, self.d_k", 3_000_000_000) == ["view_mixes_axes"]
