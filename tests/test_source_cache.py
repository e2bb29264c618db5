"""What shapeguard reads of the user's source is cached per code location, parsed one
function at a time, and read again when the file changes on disk."""

import importlib.util
import os
import textwrap

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
