"""The `shapeguard` command line: exit statuses, stdout and stderr apart, each usage error.

Model files are written to a temporary folder per test; sizes are pairwise
distinct (batch 2, heads 3, seq 5, d_k 11, d_model 33) so a swapped axis shows.
"""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from click.testing import CliRunner

import shapeguard
from shapeguard._cli import commands as _cli
from shapeguard._cli.commands import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = os.path.join(ROOT, "examples", "seed_mha.py")
CLEAN = re.compile(r"^\d+ ops in \d+ modules; 0 errors, 0 warnings$")


def seed_line(text: str) -> int:
    """The line of the seed example that contains `text` (the example may grow)."""
    with open(SEED) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


ATTENTION = """
import math

import torch
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, d_model=33, n_heads=3, k_width=None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, k_width or d_model)
        self.W_v = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        Q = self.W_q(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(B, T, self.n_heads, -1).transpose(1, 2)
        V = self.W_v(x).view(B, T, self.n_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        attn = scores.softmax(dim=-1)
        return (attn @ V).transpose(1, 2).reshape(B, T, self.d_model)
"""


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def write(tmp_path, source, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def one_line_error(result, text):
    """A usage error: exit 2, nothing on stdout, one line on stderr with `text` in it."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shapeguard: error: ")
    assert text in lines[0], lines[0]
    assert "Traceback" not in result.stderr


# -- trace: success ----------------------------------------------------------------------------


def test_trace_seed_example_shows_attention_shapes():
    result = run("trace", SEED)
    assert result.exit_code == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "model   MultiHeadAttention from build_model()"
    assert (
        out[1]
        == "inputs  x=[2, 16, 512] float32, mask=[2, 1, 16, 16] bool  (from example_inputs())"
    )
    assert "shapeguard trace" in out[2]
    scores = next(line for line in out if "│ matmul " in line and "scores" in line)
    assert "[batch=2, heads=8, seq_q=16, seq_k=16]" in scores
    assert f"seed_mha.py:{seed_line('scores = torch.matmul(Q, K.transpose')}" in scores
    assert CLEAN.match(out[-1])
    assert result.stderr == ""
    assert "\x1b[" not in result.stdout  # piped output is plain


def test_trace_on_meta_needs_no_memory_and_reports_meta_tensors(tmp_path):
    target = tmp_path / "trace.json"
    result = run("trace", SEED, "--device", "meta", "--json", target)
    assert result.exit_code == 0, result.stderr
    data = json.loads(target.read_text())
    devices = {t["device"] for e in data["events"] for t in e["outputs"]}
    assert devices == {"meta"}
    assert CLEAN.match(result.stdout.splitlines()[-1])


def test_trace_freezes_the_collector_for_its_forward_and_leaves_it_as_it_was(monkeypatch):
    # The objects before the forward are frozen for its duration (a full collection would
    # walk them all), unfrozen after; someone else's freeze is left alone.
    import gc

    from shapeguard._cli import run as _run

    seen: list[int] = []
    monkeypatch.setattr(_run, "on_device", _recording_device(seen, _run.on_device))
    assert gc.get_freeze_count() == 0
    assert run("trace", SEED).exit_code == 0
    assert seen and all(count > 0 for count in seen)
    assert gc.get_freeze_count() == 0
    seen.clear()
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert run("trace", SEED).exit_code == 0
        # Not frozen again, nor thawed (frozen objects may still be freed: at most before).
        assert len(seen) == 1 and 0 < seen[0] <= before
        assert 0 < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def _recording_device(seen: list, on_device):
    """`on_device`, noting the collector's freeze count as the forward starts."""
    import contextlib
    import gc

    @contextlib.contextmanager
    def recording(device):
        seen.append(gc.get_freeze_count())
        with on_device(device):
            yield

    return recording


def test_tensors_made_inside_forward_are_on_meta_too(tmp_path):
    causal = ATTENTION.replace(
        "        if mask is not None:",
        "        mask = torch.ones(T, T, dtype=torch.bool).tril()  # no device=: cpu, or meta\n"
        "        if mask is not None:",
    )
    path = write(tmp_path, causal)
    result = run("trace", path, "--device", "meta")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "│ masked_fill " in result.stdout


def test_trace_json_file_has_the_versioned_schema(tmp_path):
    from shapeguard._trace.record import SCHEMA_VERSION

    target = tmp_path / "out.json"
    result = run("trace", SEED, "--json", target)
    assert result.exit_code == 0
    data = json.loads(target.read_text())
    assert data["schema"] == "shapeguard.trace"
    assert data["schema_version"] == SCHEMA_VERSION
    assert len(data["events"]) > 10
    scores = [e for e in data["events"] if e["outputs"][0]["role"] == "scores"][0]
    assert scores["outputs"][0]["shape"] == [2, 8, 16, 16]
    assert scores["outputs"][0]["axes"] == ["batch", "heads", "seq_q", "seq_k"]
    assert data["findings"] == []


def test_trace_json_to_stdout_replaces_the_table():
    result = run("trace", SEED, "--json", "-")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["schema"] == "shapeguard.trace"


def test_trace_html_report(tmp_path):
    try:
        import shapeguard.report.html  # noqa: F401  (written under another issue)
    except ImportError:
        pytest.skip(
            "shapeguard.report.html is not in this tree yet; only the option's wiring is tested"
        )
    target = tmp_path / "report.html"
    result = run("trace", SEED, "--html", target)
    assert result.exit_code == 0, result.stderr
    page = target.read_text()
    assert "<html" in page.lower()
    assert "seq_k" in page


def test_trace_all_ops_shows_more_rows():
    nanogpt = os.path.join(ROOT, "examples", "nanogpt_attention.py")
    plain = run("trace", nanogpt).stdout
    every = run("trace", nanogpt, "--all-ops").stdout
    assert every.count("\n") > plain.count("\n")
    assert "│ 0 " in every and "│ 0 " not in plain  # c_attn's fused q/k/v projection


def test_repeated_layers_fold_unless_asked(tmp_path):
    path = write(
        tmp_path,
        ATTENTION
        + """

class Stack(nn.Module):
    def __init__(self, layers=4):
        super().__init__()
        self.d_model = 33
        self.blocks = nn.ModuleList(SelfAttention() for _ in range(layers))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x
""",
    )
    folded = run("trace", path)
    assert folded.exit_code == 0, folded.stderr
    assert "blocks.0 " in folded.stdout and "blocks.3 " not in folded.stdout
    assert "rows not shown: they repeat rows above in another layer" in folded.stdout
    lines = folded.stdout.splitlines()
    assert re.match(r"\d+ rows not shown", lines[-4])
    assert lines[-3].startswith("reach #") and " in blocks.0 (model.py:" in lines[-3]
    assert lines[-2] == (
        "3 reach sites not shown: they repeat a site above in another layer (--no-fold shows them)"
    )
    assert CLEAN.match(lines[-1])
    every = run("trace", path, "--no-fold")
    assert "blocks.3 " in every.stdout and "not shown" not in every.stdout
    assert [
        line.split(" in ")[1].split(" ")[0]
        for line in every.stdout.splitlines()
        if line.startswith("reach #")
    ] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]


# -- trace: violations and crashes (exit 1) ----------------------------------------------------


@pytest.mark.no_shapeguard  # the guarded constructor raises on purpose
def test_constructor_violation_exits_1_with_the_message_on_stdout():
    result = run("trace", SEED, "--arg", "n_heads=6")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "error: d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in MultiHeadAttention(...)"
    )
    assert lines[1].startswith("  in  MultiHeadAttention at ")
    assert lines[1].endswith(f"seed_mha.py:{seed_line('class MultiHeadAttention')}")
    assert lines[2].strip() == "MultiHeadAttention(n_heads=6)  # called by shapeguard"
    assert lines[3].startswith("  hint: head counts that work for d_model=512: 1, 2, 4, 8")
    assert result.stderr == "shapeguard: head_divisibility violation in " + SEED + "\n"


@pytest.mark.no_shapeguard
def test_forward_violation_exits_1_with_findings_after_the_table(tmp_path):
    path = write(
        tmp_path, ATTENTION + "\n\ndef build_model():\n    return SelfAttention(k_width=30)\n"
    )
    result = run("trace", path)
    assert result.exit_code == 1
    assert "Traceback" not in result.stdout + result.stderr
    out = result.stdout
    message = out[out.index("error: ") :]
    assert message.splitlines()[0].startswith("error: scores = Q @ K^T: Q.d_k (11) != K^T.")
    assert message.splitlines()[0].endswith(" (10)")
    assert "model.py:23" in message.splitlines()[1]
    assert (
        message.splitlines()[2].strip() == "scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)"
    )
    assert result.stderr == f"shapeguard: 1 error in {path}\n"


@pytest.mark.no_shapeguard  # warns on purpose
def test_a_warning_is_a_violation(tmp_path):
    path = write(tmp_path, ATTENTION.replace("scores.softmax(dim=-1)", "scores.softmax(dim=-2)"))
    result = run("trace", path)
    assert result.exit_code == 1
    assert "warning: softmax over seq_q (dim -2) of scores" in result.stdout
    assert result.stdout.count("\n0 errors, 1 warning") == 0
    assert "; 0 errors, 1 warning\n" in result.stdout
    assert result.stderr == f"shapeguard: 1 warning in {path}\n"


def test_model_crash_exits_1_without_traceback_unless_asked(tmp_path):
    path = write(
        tmp_path,
        """
        from torch import nn

        class Broken(nn.Module):
            def __init__(self, d_model=33):
                super().__init__()
                self.d_model = d_model
                self.proj = nn.Linear(d_model, d_model)

            def forward(self, x):
                return self.proj(x) * self.n_heads
    """,
    )
    result = run("trace", path)
    assert result.exit_code == 1
    message = result.stdout[result.stdout.index("error: ") :].splitlines()
    assert (
        message[0]
        == "error: forward raised AttributeError: 'Broken' object has no attribute 'n_heads'"
    )
    assert message[1].endswith("model.py:11")
    assert message[2].strip() == "return self.proj(x) * self.n_heads"
    assert result.stderr == "shapeguard: the model crashed in forward\n"
    verbose = run("trace", path, "--traceback")
    assert verbose.exit_code == 1
    assert verbose.stderr.startswith("Traceback (most recent call last):")
    assert "AttributeError: 'Broken' object has no attribute 'n_heads'" in verbose.stderr


def test_constructor_crash_exits_1(tmp_path):
    path = write(
        tmp_path,
        """
        from torch import nn

        class M(nn.Module):
            def __init__(self, d_model=33, n_heads=3):
                super().__init__()
                assert d_model % n_heads == 0, "heads must divide d_model"
    """,
    )
    result = run("trace", path, "--arg", "n_heads=4")
    assert result.exit_code == 1
    assert result.stdout.startswith(
        "error: building the model (M(n_heads=4)) raised AssertionError: heads must divide d_model\n"
    )


@pytest.mark.no_shapeguard  # the guarded constructor raises on purpose
def test_shape_error_at_import_time_exits_1(tmp_path):
    path = write(
        tmp_path,
        """
        import shapeguard
        from torch import nn

        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.d_model, self.n_heads = 33, 4

        model = shapeguard.guard(Attn())
    """,
    )
    result = run("trace", path)
    assert result.exit_code == 1
    first = result.stdout.splitlines()[0]
    assert first.startswith("error: d_model=33 is not divisible by n_heads=4"), first
    assert result.stderr == f"shapeguard: head_divisibility violation in {path}\n"


# -- trace: usage errors (exit 2, one line) ----------------------------------------------------


def test_missing_file(tmp_path):
    one_line_error(run("trace", tmp_path / "nope.py"), "no such file: ")


def test_folder_instead_of_file(tmp_path):
    one_line_error(run("trace", tmp_path), "is a folder; give the path of a Python file")


def test_syntax_error_in_the_file(tmp_path):
    path = write(tmp_path, "import torch\ndef f(:\n    pass\n")
    one_line_error(run("trace", path), "syntax error at ")
    assert "model.py:2: invalid syntax; fix the file and run again" in run("trace", path).stderr


def test_import_error_in_the_file(tmp_path):
    path = write(tmp_path, "import not_a_module_anywhere_1234\n")
    one_line_error(
        run("trace", path),
        "importing model.py failed: No module named 'not_a_module_anywhere_1234'",
    )


def test_no_model(tmp_path):
    path = write(tmp_path, "import torch\nx = 1\n")
    one_line_error(
        run("trace", path), "model.py defines no model: add `model = ...`, a `build_model()`"
    )


def test_ambiguous_model(tmp_path):
    path = write(
        tmp_path,
        """
        from torch import nn
        class A(nn.Module):
            def forward(self, x): return x
        class B(nn.Module):
            def forward(self, x): return x
    """,
    )
    one_line_error(
        run("trace", path), "model.py defines several models (A, B); pick one with --model NAME"
    )


def test_the_class_that_builds_the_others_is_the_model(tmp_path):
    path = write(
        tmp_path,
        ATTENTION
        + """

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.d_model = 33
        self.attn = SelfAttention()

    def forward(self, x):
        return x + self.attn(x)
""",
    )
    result = run("trace", path)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("model   Block\n")


def test_model_by_name_class_factory_and_instance(tmp_path):
    path = write(
        tmp_path,
        ATTENTION
        + """

def small():
    return SelfAttention(d_model=39, n_heads=3)

wide = SelfAttention(d_model=45, n_heads=3)
""",
    )
    by_class = run("trace", path, "--model", "SelfAttention", "--arg", "d_model=21")
    assert by_class.exit_code == 0, by_class.stderr
    assert by_class.stdout.startswith(
        "model   SelfAttention from --model SelfAttention (d_model=21)\n"
    )
    assert "x=[2, 5, 21] float32" in by_class.stdout
    by_factory = run("trace", path, "--model", "small")
    assert by_factory.exit_code == 0
    assert "x=[2, 5, 39]" in by_factory.stdout
    by_instance = run("trace", path, "--model", "wide")
    assert "x=[2, 5, 45]" in by_instance.stdout


def test_model_name_not_found(tmp_path):
    path = write(tmp_path, ATTENTION)
    one_line_error(
        run("trace", path, "--model", "Nope"),
        "model.py has no 'Nope'; models found there: SelfAttention",
    )


def test_arg_for_an_instance(tmp_path):
    path = write(tmp_path, ATTENTION + "\nwide = SelfAttention()\n")
    one_line_error(
        run("trace", path, "--model", "wide", "--arg", "n_heads=3"),
        "--arg needs a class or a factory, but --model wide is an instance already built",
    )


@pytest.mark.parametrize(
    ("item", "text"),
    [
        ("n_heads", "--arg 'n_heads' is not NAME=VALUE; write e.g. --arg n_heads=8"),
        ("=3", "is not NAME=VALUE"),
        ("n_heads=3x", "'3x' is not a Python literal"),
        (
            "n_hedas=3",
            "SelfAttention takes no argument 'n_hedas' (it takes: d_model, n_heads, k_width)",
        ),
    ],
)
def test_bad_arg(tmp_path, item, text):
    path = write(tmp_path, ATTENTION)
    one_line_error(run("trace", path, "--arg", item), text)


def test_missing_constructor_argument(tmp_path):
    path = write(
        tmp_path,
        """
        from torch import nn
        class M(nn.Module):
            def __init__(self, d_model):
                super().__init__()
                self.proj = nn.Linear(d_model, d_model)
            def forward(self, x): return self.proj(x)
    """,
    )
    one_line_error(run("trace", path), "M needs d_model; pass --arg d_model=VALUE")


@pytest.mark.parametrize(
    ("item", "text"),
    [
        ("x", "--input 'x' is not NAME=SHAPE; write e.g. --input x=2,16,512"),
        ("x=2,a,33", "'2,a,33' is not a list of sizes"),
        (
            "x=floaty:2,5,33",
            "'floaty' is not a torch dtype; use e.g. float32, bfloat16, bool, int64",
        ),
        (
            "y=2,5,33",
            "SelfAttention.forward(x, mask=...) has no parameter 'y'; name one of: x, mask",
        ),
        ("x=", "give the sizes as non-negative integers"),
    ],
)
def test_bad_input(tmp_path, item, text):
    path = write(tmp_path, ATTENTION)
    one_line_error(run("trace", path, "--input", item), text)


@pytest.mark.parametrize("item", ["seq", "seq=0", "seq=five"])
def test_bad_dim(tmp_path, item):
    path = write(tmp_path, ATTENTION)
    one_line_error(run("trace", path, "--dim", item), "is not NAME=SIZE with a positive size")


def test_no_size_to_make_an_input_from(tmp_path):
    path = write(
        tmp_path,
        """
        import torch
        from torch import nn
        class M(nn.Module):
            def forward(self, x):
                return torch.relu(x)
    """,
    )
    one_line_error(run("trace", path), "cannot tell the size of 'x': M declares no d_model")
    assert run("trace", path, "--dim", "d_model=13").exit_code == 0


def test_unwritable_json_path(tmp_path):
    one_line_error(
        run("trace", SEED, "--json", tmp_path / "no" / "such" / "dir.json"), "cannot write "
    )


# -- inputs ------------------------------------------------------------------------------------


def test_inputs_from_the_convention_read_d_model_from_the_module(tmp_path):
    path = write(tmp_path, ATTENTION)
    result = run("trace", path)
    assert result.exit_code == 0, result.stderr
    # seq 5 is taken by nothing; d_k=11 and heads=3 are declared, so batch and seq avoid them.
    assert result.stdout.splitlines()[1] == (
        "inputs  x=[2, 5, 33] float32  "
        "(made up from the [batch, seq, d_model] convention: batch=2, seq=5, d_model=33)"
    )


def test_convention_gives_keys_and_values_their_own_length(tmp_path):
    path = write(
        tmp_path,
        """
        from torch import nn

        class Cross(nn.Module):
            def __init__(self):
                super().__init__()
                self.attn = nn.MultiheadAttention(33, 3, batch_first=True)

            def forward(self, query, key, value):
                return self.attn(query, key, value, need_weights=False)[0]
    """,
    )
    result = run("trace", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1] == (
        "inputs  query=[2, 5, 33] float32, key=[2, 7, 33] float32, value=[2, 7, 33] float32  "
        "(made up from the [batch, seq, d_model] convention: batch=2, seq=5, d_model=33, seq_k=7)"
    )


def test_dim_sets_convention_sizes(tmp_path):
    path = write(tmp_path, ATTENTION)
    result = run("trace", path, "--dim", "seq=7", "--dim", "batch=4")
    assert "x=[4, 7, 33] float32" in result.stdout


def test_inputs_from_jaxtyping_annotations(tmp_path):
    path = write(
        tmp_path,
        """
        import torch
        from jaxtyping import Bool, Float
        from torch import Tensor, nn

        class Attn(nn.Module):
            def __init__(self, d_model=33, n_heads=3):
                super().__init__()
                self.d_model, self.n_heads = d_model, n_heads
                self.proj = nn.Linear(d_model, d_model)

            def forward(self, x: Float[Tensor, "batch seq d_model"],
                        memory: Float[Tensor, "batch seq_k d_model"],
                        mask: Bool[Tensor, "batch 1 seq seq_k"] | None = None):
                return self.proj(x)
    """,
    )
    result = run("trace", path)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[1] == (
        "inputs  x=[2, 5, 33] float32, memory=[2, 7, 33] float32, "
        "mask=[2, 1, 5, 7] bool (True = real token; lengths 7, 5)  "
        "(made up from the forward's annotations: d_model=33, batch=2, seq=5, seq_k=7)"
    )
    bound = run("trace", path, "--dim", "seq_k=13")
    assert "memory=[2, 13, 33] float32, mask=[2, 1, 5, 13] bool (" in bound.stdout


def test_example_inputs_may_return_a_tuple_or_args_and_kwargs(tmp_path):
    tuple_form = write(
        tmp_path,
        ATTENTION
        + """

def example_inputs():
    return (torch.randn(2, 7, 33),)
""",
        "tuple_form.py",
    )
    result = run("trace", tuple_form)
    assert result.exit_code == 0, result.stderr
    assert "x=[2, 7, 33] float32  (from example_inputs())" in result.stdout
    pair_form = write(
        tmp_path,
        ATTENTION
        + """

def example_inputs():
    return (torch.randn(2, 7, 33),), {"mask": torch.ones(2, 1, 7, 7, dtype=torch.bool)}
""",
        "pair_form.py",
    )
    result = run("trace", pair_form)
    assert result.exit_code == 0, result.stderr
    assert "x=[2, 7, 33] float32, mask=[2, 1, 7, 7] bool  (from example_inputs())" in result.stdout


@pytest.mark.no_shapeguard
def test_input_option_overrides_example_inputs():
    result = run("trace", SEED, "--input", "mask=bool:2,1,16,16", "--input", "x=2,16,512")
    assert result.exit_code == 0, result.stderr
    assert "(from example_inputs() with --input mask, x)" in result.stdout
    bad = run("trace", SEED, "--input", "x=2,16,500")
    assert bad.exit_code == 1
    first = bad.stdout[bad.stdout.index("error: ") :].splitlines()[0]
    assert "500" in first and "512" in first, first


@pytest.mark.no_shapeguard
def test_input_option_with_a_dtype_prefix(tmp_path):
    path = write(tmp_path, ATTENTION)
    result = run("trace", path, "--input", "x=float64:2,5,33", "--input", "mask=bool:2,1,5,5")
    assert result.stdout.splitlines()[1].startswith(
        "inputs  x=[2, 5, 33] float64, mask=[2, 1, 5, 5] bool"
    )


MLP = """
from torch import nn


class MLP(nn.Sequential):  # torch's forward: no line of the file names a tensor
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
"""


@pytest.mark.no_shapeguard
def test_a_model_without_attention_says_how_to_see_its_ops(tmp_path):
    # An empty table would read as "nothing ran": the line under it says what was left
    # out, in the spelling of the caller (the CLI's flag, the API's argument).
    path = write(tmp_path, MLP)
    result = run("trace", path, "--input", "input=2,5,8")
    assert result.exit_code == 0, result.output
    assert (
        "no attention tensor (Q, K, V, scores, attn, mask, context, out) among its 3 ops: "
        "--all-ops lists them all" in result.stdout
    )
    every = run("trace", path, "--input", "input=2,5,8", "--all-ops")
    assert "no attention tensor" not in every.stdout and "relu" in every.stdout
    spec = importlib.util.spec_from_file_location("mlp_for_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = shapeguard.trace(module.MLP(), torch.randn(2, 5, 8)).table()
    assert "among its 3 ops: table(all_ops=True) lists them all" in table
    with_attention = run("trace", SEED)
    assert "no attention tensor" not in with_attention.stdout


# -- check -------------------------------------------------------------------------------------


def test_check_passes_on_the_seed_example(monkeypatch):
    monkeypatch.setattr(_cli, "probe_runner", lambda: None)
    result = run("check", SEED)
    assert result.exit_code == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert "trace" in rows[0] and "pass" in rows[0] and " modules; 0 errors, 0 warnings" in rows[0]
    assert "semantic probes" in rows[1] and "skip" in rows[1]


@pytest.mark.no_shapeguard
def test_check_fails_on_a_finding(tmp_path, monkeypatch):
    monkeypatch.setattr(_cli, "probe_runner", lambda: None)
    path = write(
        tmp_path, ATTENTION + "\n\ndef build_model():\n    return SelfAttention(k_width=30)\n"
    )
    result = run("check", path)
    assert result.exit_code == 1
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert "FAIL" in rows[0]
    assert "matmul_inner" in rows[1] and "FAIL" in rows[1]
    assert "the trace failed; fix that first" in result.stdout
    # Below the summary table: the full message, in the house format.
    detail = result.stdout[result.stdout.index("\nscores = Q @ K^T: Q.d_k (11) != K^T.") :]
    assert detail.splitlines()[2].startswith("  in  SelfAttention at ")
    assert detail.splitlines()[2].endswith("model.py:23")
    assert result.stderr == f"shapeguard: 2 checks failed in {path}\n"


def test_check_runs_the_pluggable_probes(monkeypatch):
    calls = []

    from shapeguard._probes.report import CheckReport
    from shapeguard._probes.result import ProbeResult

    def run_probes(model, args, kwargs):
        calls.append((type(model).__name__, [tuple(a.shape) for a in args], sorted(kwargs)))
        return CheckReport(
            type(model).__name__,
            [
                ProbeResult("batch_independence", "passed", "rows do not mix"),
                ProbeResult(
                    "causality", "failed", "token 3 sees token 4\n  hint: use tril, not triu"
                ),
            ],
        )

    monkeypatch.setitem(
        sys.modules, "shapeguard._probes.check", types.SimpleNamespace(run_probes=run_probes)
    )
    result = run("check", SEED)
    assert calls == [("MultiHeadAttention", [(2, 16, 512)], ["mask"])]
    assert result.exit_code == 1
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert "batch_independence" in rows[1] and "pass" in rows[1]
    assert "causality" in rows[2] and "FAIL" in rows[2] and "token 3 sees token 4" in rows[2]
    assert "token 3 sees token 4\n  hint: use tril, not triu" in result.stdout
    assert result.stderr.endswith("1 check failed in " + SEED + "\n")


def test_check_runs_the_real_probes_when_installed():
    result = run("check", SEED)
    assert result.exit_code == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert "trace" in rows[0] and "pass" in rows[0]
    assert not any("shape checks" in row for row in rows)  # the trace row says it already
    assert any("batch independence" in row and "pass" in row for row in rows[1:])
    assert not any("FAIL" in row for row in rows)


def test_check_marks_probes_that_do_not_apply_as_n_a_with_the_reason():
    result = run("check", SEED)
    assert result.exit_code == 0, result.stdout + result.stderr
    rows = {
        cells[0]: cells[1:]
        for cells in (
            [c.strip() for c in line.strip("│").split("│")]
            for line in result.stdout.splitlines()
            if line.startswith("│")
        )
    }
    assert rows["token-permutation equivariance"] == [
        "n/a",
        "the module is causal (a triangular mask in masked_fill)",
    ]
    assert rows["key-padding invariance"][0] == "n/a"
    assert not any(status == "skip" for status, _ in rows.values())


def test_probe_rows_read_the_probes_report_in_the_summarys_words():
    from shapeguard._cli.check_summary import probe_rows
    from shapeguard._probes.report import CheckReport
    from shapeguard._probes.result import ProbeResult, inconclusive, not_applicable

    report = CheckReport(
        "Attn",
        [
            ProbeResult("shape checks", "passed", "12 ops traced, no finding"),  # the trace's row
            ProbeResult("batch independence", "passed", "max deviation 0"),
            ProbeResult("causality", "failed", "token 3 moved token 1\n  hint: mask it"),
            inconclusive("sub-batch consistency", "the module rejects 1 example"),
            not_applicable("key-padding invariance", "no mask"),
        ],
    )
    assert probe_rows(report) == [
        ("batch independence", "pass", "max deviation 0"),
        ("causality", "FAIL", "token 3 moved token 1\n  hint: mask it"),
        ("sub-batch consistency", "inconclusive", "the module rejects 1 example"),
        ("key-padding invariance", "n/a", "no mask"),
    ]


def test_check_skips_probes_on_meta(monkeypatch):
    monkeypatch.setattr(_cli, "probe_runner", lambda: pytest.fail("probes must not run on meta"))
    result = run("check", SEED, "--device", "meta")
    assert result.exit_code == 0
    assert "probes compare real values; run without --device meta" in result.stdout


# -- the progress bar, only on a terminal ------------------------------------------------------


@pytest.mark.no_shapeguard
def test_progress_bar_only_on_a_terminal(monkeypatch):
    import io

    import torch
    from rich.console import Console

    model = torch.nn.Sequential(*(torch.nn.Linear(3, 3) for _ in range(9)))
    buffer = io.StringIO()
    monkeypatch.setattr(
        _cli, "_console", lambda stderr=False: Console(file=buffer, force_terminal=True)
    )
    with _cli._module_progress(model, "tracing"):
        model(torch.zeros(1, 3))
    assert "tracing" in buffer.getvalue()
    piped = io.StringIO()
    monkeypatch.setattr(
        _cli, "_console", lambda stderr=False: Console(file=piped, force_terminal=False)
    )
    with _cli._module_progress(model, "tracing"):
        model(torch.zeros(1, 3))
    assert piped.getvalue() == ""
    assert not torch.nn.modules.module._global_forward_pre_hooks  # the hook is gone


# -- entry points ------------------------------------------------------------------------------


def test_help_and_version():
    result = run("--help")
    assert result.exit_code == 0
    assert "trace" in result.stdout and "check" in result.stdout and "explain" in result.stdout
    from shapeguard._version import __version__

    assert run("--version").stdout == f"shapeguard, version {__version__}\n"


def test_installed_console_script_runs_in_a_subprocess():
    script = shutil.which("shapeguard")
    if script is None:
        pytest.fail("the `shapeguard` console script is not installed: pip install -e .")
    done = subprocess.run(
        [script, "trace", SEED], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert CLEAN.match(done.stdout.splitlines()[-1])
    assert done.stderr == ""


def test_python_dash_m_reports_usage_errors_with_status_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "shapeguard", "trace", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("shapeguard: error: no such file: ")


@pytest.mark.no_shapeguard  # warns on purpose
def test_strict_stops_at_the_first_warning(tmp_path):
    path = write(tmp_path, ATTENTION.replace("scores.softmax(dim=-1)", "scores.softmax(dim=-2)"))
    relaxed = run("trace", path)
    strict = run("trace", path, "--strict")
    assert relaxed.exit_code == strict.exit_code == 1
    assert relaxed.stdout.count("│ matmul ") == 2  # went on to attn @ V
    assert strict.stdout.count("│ matmul ") == 1  # stopped at the softmax
    assert "warning: softmax over seq_q (dim -2) of scores" in strict.stdout


@pytest.mark.no_shapeguard
def test_json_schema_doc_lists_exactly_the_fields_written():
    clean = json.loads(run("trace", SEED, "--json", "-").stdout)
    failed = json.loads(run("trace", SEED, "--input", "x=2,16,500", "--json", "-").stdout)
    checked = json.loads(run("check", SEED, "--json", "-").stdout)
    written = {
        "Trace": set(clean),
        "Event": set(clean["events"][0]),
        "Tensor": set(clean["events"][0]["outputs"][0]),
        "Finding": set(failed["findings"][0]),
        "Check": set(checked["check"]),
        "Result": set(checked["check"]["results"][0]),
        "CheckReport": set(checked["check"]["probes"]),
        "ProbeResult": set(checked["check"]["probes"]["results"][0]),
    }
    assert set(checked) == set(clean) | {"check"}
    with open(os.path.join(ROOT, "docs", "json-schema.md"), encoding="utf-8") as f:
        sections = re.split(r"^## ", f.read(), flags=re.MULTILINE)[1:]
    documented = {
        section.split()[0]: set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE))
        for section in sections
    }
    for name, fields in written.items():
        assert documented[name] == fields, name


def test_a_70b_shaped_layer_traces_on_meta_with_no_memory():
    import importlib.util

    path = os.path.join(ROOT, "bench", "meta_scale.py")
    spec = importlib.util.spec_from_file_location("_meta_scale_under_test", path)
    meta_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(meta_scale)
    memory = meta_scale.cpu_memory(layers=1)
    d, kv, ffn = 8192, 1024, 28672
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d  # q, o; k, v; MLP; two norms
    assert memory["parameters"] == per_layer + d  # and the final norm
    assert memory["parameter_bytes"] == 2 * memory["parameters"]  # bfloat16
    assert memory["input_bytes"] == 8192 * d * 2
    result = run("trace", meta_scale.MODEL_FILE, "--device", "meta", "--arg", "n_layers=1")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "x=[1, 8192, 8192] bfloat16" in result.stdout
    # seq == d_model == 8192: the axes are named by where they come from, not by size.
    assert "[1, kv_heads=8, seq=8192, d_k=128]" in result.stdout


@pytest.mark.no_shapeguard  # the guarded constructor raises on purpose
def test_json_is_written_when_building_the_model_fails(tmp_path):
    target = tmp_path / "out.json"
    result = run("trace", SEED, "--arg", "n_heads=6", "--json", target)
    assert result.exit_code == 1
    data = json.loads(target.read_text())
    assert data["events"] == []
    assert [f["kind"] for f in data["findings"]] == ["head_divisibility"]
    assert data["findings"][0]["message"] == result.stdout.removeprefix("error: ").rstrip("\n")
