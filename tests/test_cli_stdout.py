"""What the command line writes on stdout: with `--json -` the JSON alone (the model's own
prints go to stderr), and the 80-column report no wider than 80 columns (issue 30).

The model files print as nanoGPT's does (a parameter count while it is built), at import and
in forward; sizes are pairwise distinct (batch 3, heads 4, seq 7, d_k 16).
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard  # the buggy model breaks a shape rule on purpose

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ["seed_mha", "bug_mask_shape", "bug_k_not_transposed", "bug_batch_first"]

PRINTING = """
import os

import torch
import torch.nn.functional as F
from torch import nn

print("loading the model file")


class Attn(nn.Module):
    def __init__(self, d=64, h=4):
        super().__init__()
        self.qkv, self.h = nn.Linear(d, 3 * d), h
        print("number of parameters: %.2fM" % (sum(p.numel() for p in self.parameters()) / 1e6,))

    def forward(self, x):
        print("forward on", tuple(x.shape))
        os.write(1, b"written to descriptor 1\\n")  # as C code or a child process writes
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)


def example_inputs():
    return (torch.randn(3, 7, 64),)
"""
PRINTS = ["loading the model file", "number of parameters: 0.01M", "forward on (3, 7, 64)"]


def write(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


@pytest.mark.parametrize("command", ["trace", "check"])
def test_json_to_stdout_is_the_json_alone_and_the_models_prints_go_to_stderr(tmp_path, command):
    path = write(tmp_path, PRINTING)
    result = run(command, path, "--json", "-")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)  # nothing before or after the JSON
    assert report["schema"] == "shapeguard.trace"
    assert ("check" in report) == (command == "check")
    for line in PRINTS:
        assert line in result.stderr.splitlines(), result.stderr


def test_without_json_to_stdout_the_models_prints_stay_on_stdout(tmp_path):
    path = write(tmp_path, PRINTING)
    result = run("trace", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == PRINTS[:2]
    assert PRINTS[2] in lines
    assert result.stderr == ""


def test_json_to_stdout_holds_a_failures_report_and_stdout_is_restored(tmp_path):
    # The forward breaks a shape rule: exit 1, the report of it on stdout as JSON, the
    # model's print on stderr; the command leaves sys.stdout as it found it.
    buggy = PRINTING.replace(
        "F.scaled_dot_product_attention(q, k, v)",
        "F.scaled_dot_product_attention(q, k.transpose(-2, -1), v)",
    )
    path = write(tmp_path, buggy)
    before = sys.stdout
    result = run("trace", path, "--json", "-")
    assert sys.stdout is before
    assert result.exit_code == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert [f["severity"] for f in report["findings"]][-1] == "error"
    assert "forward on (3, 7, 64)" in result.stderr.splitlines()
    assert result.stderr.splitlines()[-1].startswith("shapeguard: ")


def test_json_to_stdout_when_the_file_fails_to_import_leaves_stdout_empty(tmp_path):
    path = write(tmp_path, 'print("about to fail")\nimport not_a_real_module_xyz\n')
    result = run("trace", path, "--json", "-")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr.splitlines()[0] == "about to fail"
    assert "not_a_real_module_xyz" in result.stderr.splitlines()[-1]


def test_json_to_stdout_in_a_real_process_moves_descriptor_1_too(tmp_path):
    # Output written to the descriptor itself (C code, a child process) bypasses
    # sys.stdout; in a real process that goes to stderr as well.
    path = write(tmp_path, PRINTING)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("COLUMNS", None)
    done = subprocess.run(
        [sys.executable, "-m", "shapeguard", "trace", str(path), "--json", "-"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["schema"] == "shapeguard.trace"
    err = done.stderr.splitlines()
    assert "written to descriptor 1" in err
    for line in PRINTS:
        assert line in err


# -- the report's width --------------------------------------------------------------------


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_line_of_the_trace_report_fits_the_width(example, width, monkeypatch):
    """tests/test_golden.py's examples, rendered as wide as COLUMNS says: no line is wider,
    the two lines above the table included (the inputs line was 81 at 80 columns)."""
    monkeypatch.chdir(ROOT)
    result = run("trace", f"examples/{example}.py", env={"COLUMNS": str(width), "NO_COLOR": "1"})
    assert result.exit_code in (0, 1), result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("model   ") and lines[1].startswith("inputs  ")
    wide = [(len(line), line) for line in lines if len(line) > width]
    assert not wide, wide


def test_the_inputs_line_wraps_under_its_label_at_80_columns(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = run("trace", "examples/seed_mha.py", env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[:3] == [
        "model   MultiHeadAttention from build_model()",
        "inputs  x=[2, 16, 512] float32, mask=[2, 1, 16, 16] bool",
        "        (from example_inputs())",
    ]


def test_every_line_of_the_check_report_fits_80_columns(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = run("check", "examples/seed_mha.py", env={"COLUMNS": "80", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.stderr
    wide = [(len(line), line) for line in result.stdout.splitlines() if len(line) > 80]
    assert not wide, wide
    assert result.stdout.splitlines()[2] == "        (from example_inputs())"


def test_a_long_model_line_wraps_between_its_arguments_and_a_long_input_between_words():
    import types

    import torch
    from torch import nn

    from shapeguard.report.text import render_target

    class Wide(nn.Module):
        def forward(self, x, memory):
            return x

    kwargs = {f"layer_{i}_width": 1000 + i for i in range(8)}
    picked = types.SimpleNamespace(model=Wide(), kwargs=kwargs, how="Wide")
    inputs = types.SimpleNamespace(
        args=(torch.zeros(3, 7, 64),),
        kwargs={"memory": {f"level_{i}": torch.zeros(3, 5, 64) for i in range(4)}},
        how="--input",
    )
    text = render_target(picked, inputs, width=80)
    assert text.splitlines() == [
        "model   Wide (layer_0_width=1000, layer_1_width=1001, layer_2_width=1002,",
        "        layer_3_width=1003, layer_4_width=1004, layer_5_width=1005,",
        "        layer_6_width=1006, layer_7_width=1007)",
        "inputs  x=[3, 7, 64] float32,",
        "        memory={level_0: [3, 5, 64] float32, level_1: [3, 5, 64] float32,",
        "        level_2: [3, 5, 64] float32, level_3: [3, 5, 64] float32}",
        "        (from --input)",
    ]
    # Unwrapped, the same text on two lines, as before widths were given.
    assert render_target(picked, inputs).splitlines() == [
        "model   Wide (" + ", ".join(f"{k}={v}" for k, v in kwargs.items()) + ")",
        "inputs  x=[3, 7, 64] float32, memory={"
        + ", ".join(f"level_{i}: [3, 5, 64] float32" for i in range(4))
        + "}  (from --input)",
    ]


def test_json_to_stdout_holds_a_report_made_while_the_model_is_built(tmp_path):
    # The guarded constructor raises before any forward (the early report's path).
    path = write(
        tmp_path,
        """
        from torch import nn

        import shapeguard

        print("building")


        @shapeguard.guard
        class MultiHeadAttention(nn.Module):
            def __init__(self, d_model=64, n_heads=6):
                super().__init__()
                self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
                self.W_q = nn.Linear(d_model, d_model)

            def forward(self, x):
                return self.W_q(x)
        """,
    )
    result = run("trace", path, "--json", "-")
    assert result.exit_code == 1, result.stdout + result.stderr
    assert [f["kind"] for f in json.loads(result.stdout)["findings"]] == ["head_divisibility"]
    assert result.stderr.splitlines() == [
        "building",
        f"shapeguard: head_divisibility violation in {path}",
    ]
