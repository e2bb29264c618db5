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
    tree = _source._trees.get(parsed[0])[1]
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


SHAPES = '''
import functools

import torch


def plain(x):
    scores = x @ x.T
    return scores.softmax(-1)


def ends_in_a_call_over_lines(x):
    y = x + 1
    return torch.cat(
        [y, y],
        dim=0,
    )


def ends_in_pass_after_else(x):
    if x.sum() > 0:
        z = x * 2
    else:
        pass


def ends_in_a_string(x):
    y = x + 1
    return y
    """
dead code after the return, a string whose lines sit at column 0
"""


def ends_in_a_comment(x):
    w = x.exp()
    return w  # the end
    # a comment after it


@functools.lru_cache(maxsize=None)
def decorated(n):
    return torch.ones(n) * 3


def with_a_nested_function(x):
    def inner(t):
        return t.relu()

    out = inner(x)
    return out.sum()


def signature_over_lines(
    x,
    scale=2.0,
):
    scaled = x * scale
    return scaled


class Model(torch.nn.Module):
    @torch.no_grad()
    def forward(self, x):
        hidden = x.tanh()
        return hidden.mean(
            dim=-1
        )

    def ends_in_a_string(self, x):
        y = x.abs()
        return y, """
a string whose lines
sit at column 0"""
'''


def test_a_function_parsed_alone_indexes_as_the_whole_file_does(tmp_path):
    # Each function's block is cut from the file by its code object's extent, not by
    # tokenizing; whatever the cut, its sites must be the ones a whole-file parse finds.
    path = tmp_path / "shapes.py"
    path.write_text(SHAPES)
    spec = importlib.util.spec_from_file_location("shapes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    codes = [
        getattr(module, name).__code__
        for name in (
            "plain",
            "ends_in_a_call_over_lines",
            "ends_in_pass_after_else",
            "ends_in_a_string",
            "ends_in_a_comment",
            "with_a_nested_function",
            "signature_over_lines",
        )
    ]
    codes += [module.decorated.__wrapped__.__code__, module.Model.forward.__wrapped__.__code__]
    codes += [module.Model.ends_in_a_string.__code__]
    whole = _source._file_index(str(path))
    for code in codes:
        _source.forget(str(path))
        index = _source._code_index(code)
        assert index, code.co_name
        last = _source._last_line(code)
        expected = {
            key: (type(node), targets, returned)
            for key, (node, targets, returned) in whole.items()
            if code.co_firstlineno <= key[0] <= last
        }
        found = {key: (type(node), t, r) for key, (node, t, r) in index.items()}
        assert found == expected, code.co_name


def test_a_cut_that_does_not_parse_falls_back_to_the_tokenizer(tmp_path, monkeypatch):
    path = tmp_path / "shapes.py"
    path.write_text(SHAPES)
    spec = importlib.util.spec_from_file_location("shapes_fallback", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    blocks = []
    getblock = _source.inspect.getblock
    monkeypatch.setattr(
        _source.inspect, "getblock", lambda lines: blocks.append(lines[0]) or getblock(lines)
    )
    _source.forget(str(path))
    for name in ("plain", "ends_in_a_call_over_lines", "ends_in_a_comment"):
        assert _source._code_index(getattr(module, name).__code__)
    assert blocks == []  # cut by the code's extent: no tokenizing
    # `else: pass` has no instruction, but its lines are indented: still cut whole.
    assert _source._code_index(module.ends_in_pass_after_else.__code__)
    assert blocks == []
    # A string after the return (dead code: no instruction) whose lines sit at column 0:
    # the cut ends inside the string, which does not parse, so the block is tokenized.
    assert _source._code_index(module.ends_in_a_string.__code__)
    assert [line.strip() for line in blocks] == ["def ends_in_a_string(x):"]


def test_only_the_latest_parsed_functions_are_kept_and_an_evicted_one_parses_again(tmp_path):
    # A parsed block is hundreds of objects that every full garbage collection walks: a long
    # session (a test suite, a notebook) keeps the most recently used ones only. A function
    # whose tree was let go still names a site it had not reached before.
    count = _source._TREES_KEPT + 8
    body = "".join(
        f"def f{i}(x, first):\n"
        f"    if first:\n"
        f"        early_{i} = x + 1\n"
        f"        return early_{i}\n"
        f"    late_{i} = x * 2\n"
        f"    return late_{i}\n\n\n"
        for i in range(count)
    )
    path = tmp_path / "many_functions.py"
    path.write_text(body)
    spec = importlib.util.spec_from_file_location("many_functions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.ones(2, 3)

    def labels(first: bool, indices) -> list:
        with shapeguard.trace() as trace:
            for i in indices:
                getattr(module, f"f{i}")(x, first)
        return [e.outputs[0].label for e in trace.events]

    assert labels(True, range(count)) == [f"early_{i}" for i in range(count)]
    kept = [key for key in _source._trees if key[0] == str(path)]
    assert len(_source._trees) <= _source._TREES_KEPT
    assert (str(path), module.f0.__code__.co_firstlineno) not in kept  # the oldest went
    assert (str(path), getattr(module, f"f{count - 1}").__code__.co_firstlineno) in kept
    # f0's other branch: a site not built yet, in a function whose tree was let go.
    assert labels(False, [0, count - 1]) == ["late_0", f"late_{count - 1}"]
