"""`shapeguard run`: the user's own program run as `python script.py` runs it, its attention
traced on the inputs it really passes (issue 30).

Small programs in several styles are written into tmp_path: argparse, a `main()` guard, a
training loop, a script that prints and exits non-zero, a package run with `-m`, a buggy
attention. Sizes are pairwise distinct (batch 3, heads 4, seq 7, d_k 16). Most run in-process
with click's CliRunner; the comparison with `python script.py` and Ctrl-C need a process.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard  # the programs open their own traces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ATTENTION = """
import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model=64, n_heads=4):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, S, C = x.shape
        q = self.q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        k = self.k(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        v = self.v(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        attn = scores.softmax(dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(B, S, C))
"""

ARGPARSE = (
    ATTENTION
    + """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--seq", type=int, default=5)
args = parser.parse_args()
model = Attention()
y = model(torch.randn(args.batch, args.seq, 64))
print("argv", __import__("sys").argv[1:], "shape", tuple(y.shape))
"""
)

MAIN_GUARD = (
    ATTENTION
    + """
import sys


def main():
    model = Attention()
    with torch.no_grad():
        y = model(torch.randn(3, 7, 64))
    print("out", tuple(y.shape))
    print("to stderr", file=sys.stderr)
    return 3


if __name__ == "__main__":
    sys.exit(main())
"""
)

TRAINING = (
    ATTENTION
    + """
def main():
    torch.manual_seed(0)
    model = Attention()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(6):
        x = torch.randn(3, 7, 64)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print("step", step, flush=True)


if __name__ == "__main__":
    main()
"""
)

# Heads carved out of the sequence: legal (7 * 64 == 4 * 7 * 16), silently wrong.
BUGGY = (
    ATTENTION.replace(
        "q = self.q(x).view(B, S, self.n_heads, self.d_k).transpose(1, 2)",
        "q = self.q(x).view(B, self.n_heads, S, self.d_k)",
    )
    + """
model = Attention()
print("done", tuple(model(torch.randn(3, 7, 64)).shape))
"""
)

MLP_ONLY = """
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 16)

    def forward(self, x):
        return self.fc(x).relu()


print(tuple(MLP()(torch.randn(3, 7, 64)).shape))
"""


def write(folder, name: str, text: str) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, ["run", *map(str, args)])


def test_argparse_script_gets_its_own_arguments_and_its_inputs_are_traced(tmp_path):
    script = write(tmp_path, "train.py", ARGPARSE)
    result = run(script, "--batch", "3", "--seq", "7")
    assert result.exit_code == 0, result.output
    assert result.stdout == "argv ['--batch', '3', '--seq', '7'] shape (3, 7, 64)\n"
    # The shapes the script passed (3, 7), not made-up ones; the report on stderr.
    assert "shapeguard run: Attention: 1 call traced of 1, 1 input signature" in result.stderr
    assert "[batch=3, heads=4, seq_q=7, seq_k=7]" in result.stderr
    assert "train.py:22" in result.stderr  # the scores line of the user's file
    assert "1 module traced, 0 findings; exit status 0" in result.stderr


def test_main_guard_output_and_exit_status_are_the_programs(tmp_path):
    script = write(tmp_path, "main.py", MAIN_GUARD)
    env = dict(os.environ, PYTHONPATH=ROOT)
    plain = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env=env, timeout=120
    )
    result = run(script)
    assert plain.returncode == 3
    assert result.exit_code == 3
    assert result.stdout == plain.stdout == "out (3, 7, 64)\n"
    # The program's stderr first, unchanged; the report after it.
    assert result.stderr.startswith(plain.stderr)
    assert "1 module traced, 0 findings; exit status 3" in result.stderr


def test_strict_exits_1_on_findings_over_the_programs_status(tmp_path):
    clean = write(tmp_path, "main.py", MAIN_GUARD)
    assert run("--strict", clean).exit_code == 3  # no finding: the program's status
    buggy = write(tmp_path, "buggy.py", BUGGY + "\nraise SystemExit(3)\n")
    result = run("--strict", buggy)
    assert result.exit_code == 1
    assert "finding" in result.stderr and "(--strict)" in result.stderr


def test_a_finding_points_at_the_users_line(tmp_path):
    script = write(tmp_path, "buggy.py", BUGGY)
    result = run(script)
    assert result.exit_code == 0  # the program ran to its end, as it does without shapeguard
    assert result.stdout == "done (3, 7, 64)\n"
    assert "warning: q(x).view(3, 4, 7, 16): carves heads out of the seq axis" in result.stderr
    assert "buggy.py:19" in result.stderr
    assert "q = self.q(x).view(B, self.n_heads, S, self.d_k)" in result.stderr
    assert "hint:" in result.stderr


def test_steps_stops_the_training_loop_and_the_report_still_prints(tmp_path):
    script = write(tmp_path, "train.py", TRAINING)
    result = run("--steps", "2", script)
    assert result.exit_code == 0, result.output
    # Step 0 ran whole; step 1 ended at its optimizer.step, before its print.
    assert result.stdout == "step 0\n"
    assert "stopped after 2 steps (--steps)" in result.stderr
    assert "1 call traced of 2" in result.stderr
    full = run(script)
    assert full.stdout == "".join(f"step {i}\n" for i in range(6))
    assert "1 call traced of 6, 1 input signature" in full.stderr


def test_a_package_module_runs_with_m_from_the_working_directory(tmp_path, monkeypatch):
    write(tmp_path, "pkg/__init__.py", "")
    write(tmp_path, "pkg/layers.py", ATTENTION)
    write(
        tmp_path,
        "pkg/train.py",
        """
        import sys

        import torch

        from .layers import Attention

        print("path0", sys.path[0])
        print("argv", sys.argv[1:], sys.argv[0].endswith("train.py"))
        Attention()(torch.randn(3, 7, 64))
        """,
    )
    monkeypatch.chdir(tmp_path)
    result = run("-m", "pkg.train", "--lr", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"path0 {tmp_path}\nargv ['--lr', '3'] True\n"
    assert "shapeguard run: Attention: 1 call traced of 1" in result.stderr
    assert "layers.py:22" in result.stderr


def test_the_interpreters_state_is_put_back(tmp_path):
    script = write(tmp_path, "train.py", ARGPARSE)
    hooks = torch.nn.modules.module
    before = (
        sys.argv[:],
        sys.path[:],
        sys.modules["__main__"],
        len(hooks._global_forward_pre_hooks),
        len(hooks._global_forward_hooks),
    )
    assert run(script).exit_code == 0
    after = (
        sys.argv[:],
        sys.path[:],
        sys.modules["__main__"],
        len(hooks._global_forward_pre_hooks),
        len(hooks._global_forward_hooks),
    )
    assert after == before


def test_a_module_without_attention_is_not_traced_unless_named(tmp_path):
    script = write(tmp_path, "mlp.py", MLP_ONLY)
    result = run(script)
    assert result.exit_code == 0
    assert result.stdout == "(3, 7, 16)\n"
    assert "ran no module with attention (name one with --module NAME" in result.stderr
    named = run("--module", "MLP", script)
    assert "shapeguard run: MLP: 1 call traced of 1, 1 input signature" in named.stderr
    assert "0 modules traced" not in named.stderr


def test_calls_and_signatures(tmp_path):
    script = write(
        tmp_path,
        "shapes.py",
        ATTENTION
        + """
model = Attention()
for seq in (7, 7, 7, 5):
    model(torch.randn(3, seq, 64))
""",
    )
    once = run(script)
    assert "1 module traced" in once.stderr
    assert "2 calls traced of 4, 2 input signatures" in once.stderr
    twice = run("--calls", "2", script)
    assert "3 calls traced of 4, 2 input signatures" in twice.stderr


def test_json_stdout_holds_the_json_alone(tmp_path):
    script = write(tmp_path, "main.py", MAIN_GUARD)
    result = run("--json", "-", script)
    assert result.exit_code == 3
    data = json.loads(result.stdout)
    assert data["schema"] == "shapeguard.run" and data["exit_status"] == 3
    (module,) = data["modules"]
    assert module["module"] == "Attention" and module["calls_traced"] == 1
    assert module["trace"]["schema"] == "shapeguard.trace" and module["trace"]["events"]


def test_no_such_script_is_a_usage_error(tmp_path):
    result = run(tmp_path / "missing.py")
    assert result.exit_code == 2
    assert "no such file" in result.stderr


INTERRUPTED = (
    ATTENTION
    + """
import time

model = Attention()
model(torch.randn(3, 7, 64))
print("traced", flush=True)
while True:
    time.sleep(0.05)
"""
)


# Ctrl-C inside the traced forward: torch runs no always_call hook for a KeyboardInterrupt,
# so the session is still open when the program ends; what it traced is kept.
INTERRUPTED_IN_FORWARD = (
    ATTENTION.replace(
        "        attn = scores.softmax(dim=-1)\n",
        "        print('traced', flush=True)\n        while True:\n            time.sleep(0.05)\n",
    )
    + """
import time

Attention()(torch.randn(3, 7, 64))
"""
)


@pytest.mark.parametrize("program", [INTERRUPTED, INTERRUPTED_IN_FORWARD], ids=["after", "inside"])
def test_ctrl_c_ends_the_program_and_still_reports(tmp_path, program):
    script = write(tmp_path, "forever.py", program)
    env = dict(os.environ, PYTHONPATH=ROOT, COLUMNS="200")
    process = subprocess.Popen(
        [sys.executable, "-m", "shapeguard", "run", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 120
        line = process.stdout.readline()  # after the first traced forward
        assert line == "traced\n" and time.monotonic() < deadline
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert "KeyboardInterrupt" in err
    assert "shapeguard run: Attention: 1 call traced of 1" in err
    assert "1 module traced, 0 findings; interrupted" in err


# The Annotated Transformer's convention: src_mask [batch, 1, seq], unsqueezed per head.
# `shapeguard trace` makes the mask up as [batch, seq] and reports a false error
# (field report real-repositories.md, made_up_mask_shape.py); the program's own mask is right.
TUTORIAL_MASK = """
import math

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self, vocab=11, d=64, h=4):
        super().__init__()
        self.emb, self.qkv, self.h, self.dk = nn.Embedding(vocab, d), nn.Linear(d, 3 * d), h, d // h

    def forward(self, src, src_mask):
        x = self.emb(src)
        B, T, C = x.shape
        mask = src_mask.unsqueeze(1)
        q, k, v = (t.view(B, T, self.h, self.dk).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(mask == 0, -1e9)
        return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


src = torch.tensor([[3, 4, 5, 0, 0, 0, 0], [6, 7, 8, 9, 10, 1, 2], [1, 2, 0, 0, 0, 0, 0]])
src_mask = (src != 0).unsqueeze(-2)
print(tuple(Encoder()(src, src_mask=src_mask).shape))
"""


def test_the_programs_own_mask_gives_no_false_alarm(tmp_path):
    script = write(tmp_path, "tutorial.py", TUTORIAL_MASK)
    result = run(script)
    assert result.exit_code == 0, result.output
    assert result.stdout == "(3, 7, 64)\n"
    assert "0 errors, 0 warnings" in result.stderr
    # The reach read from the real mask (passed by keyword): the padded keys of each example.
    assert "padding: keys 3..6 in example 0, keys 2..6 in example 2" in result.stderr
    assert "1 module traced, 0 findings; exit status 0" in result.stderr


def test_check_runs_the_probes_on_the_real_inputs_in_eval_mode(tmp_path):
    # Dropout on the attention weights: in train mode (as the loop leaves the model) the
    # probes would compare two different draws; they run in eval mode, modes restored.
    dropping = TRAINING.replace(
        "attn = scores.softmax(dim=-1)",
        "attn = nn.functional.dropout(scores.softmax(dim=-1), 0.5, self.training)",
    )
    script = write(tmp_path, "train.py", dropping)
    result = run("--check", "--json", tmp_path / "run.json", script)
    assert result.exit_code == 0, result.output
    assert "shapeguard check" in result.stderr
    assert "FAIL" not in result.stderr
    (module,) = json.loads((tmp_path / "run.json").read_text())["modules"]
    check = module["check"]
    assert check["passed"] and check["failed"] == 0
    statuses = {row["name"]: row["status"] for row in check["results"]}
    assert statuses["trace"] == "pass"
    assert "pass" in statuses.values()


def test_check_fails_the_probes_a_bug_breaks_and_strict_exits_1(tmp_path):
    script = write(tmp_path, "buggy.py", BUGGY)
    result = run("--check", "--json", tmp_path / "run.json", script)
    assert result.exit_code == 0  # the program's status: findings and failures do not change it
    (module,) = json.loads((tmp_path / "run.json").read_text())["modules"]
    statuses = {row["name"]: row["status"] for row in module["check"]["results"]}
    # Heads carved out of the sequence mix the tokens: the probes see it on the real input.
    assert statuses["token-permutation equivariance"] == "FAIL"
    assert statuses["batch independence"] == "pass"
    assert "; failed" in result.stderr
    strict = run("--check", "--strict", script)
    assert strict.exit_code == 1
    assert "1 finding, 4 failed checks (--strict)" in strict.stderr


def test_github_annotations_follow_the_programs_output_and_html_is_written(tmp_path):
    script = write(tmp_path, "buggy.py", BUGGY)
    html = tmp_path / "run.html"
    result = run("--format", "github", "--html", html, script)
    assert result.exit_code == 0
    first, annotation = result.stdout.splitlines()
    assert first == "done (3, 7, 64)"
    assert annotation.startswith(
        f"::warning file={script},line=19,title=shapeguard view_mixes_axes::"
    )
    assert "carves heads out of the seq axis" in annotation
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") or page.lstrip().lower().startswith("<!doctype html")
    assert "carves heads out of the seq axis" in page


def test_a_forward_the_program_traces_itself_is_left_to_it(tmp_path):
    script = write(
        tmp_path,
        "own.py",
        ATTENTION
        + """
import shapeguard

model = Attention()
with shapeguard.trace() as trace:
    model(torch.randn(3, 7, 64))
print("own trace", trace.shape_of("scores"))
model(torch.randn(3, 7, 64))
""",
    )
    result = run(script)
    assert result.exit_code == 0, result.output
    assert result.stdout == "own trace (3, 4, 7, 7)\n"
    # The program's own block saw the first call (shapeguard run counts only the calls
    # outside it); shapeguard run traced the second.
    assert "shapeguard run: Attention: 1 call traced of 1, 1 input signature" in result.stderr


def test_a_training_runs_losses_are_bitwise_those_of_python(tmp_path):
    script = write(
        tmp_path,
        "losses.py",
        TRAINING.replace('print("step", step, flush=True)', "print(step, loss.item().hex())"),
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    plain = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env=env, timeout=120
    )
    result = run(script)
    assert plain.returncode == 0 and result.exit_code == 0
    assert len(plain.stdout.splitlines()) == 6
    assert result.stdout == plain.stdout


def test_steps_count_the_forwards_of_a_module_named_inside_the_model(tmp_path):
    script = write(
        tmp_path,
        "nested.py",
        TRAINING.replace(
            "model = Attention()", "model = nn.Sequential(Attention(), nn.Linear(64, 64))"
        ),
    )
    result = run("--module", "Attention", "--steps", "3", script)
    assert result.exit_code == 0, result.output
    assert result.stdout == "step 0\nstep 1\n"
    assert "shapeguard run: Attention: 1 call traced of 3" in result.stderr
    assert "stopped after 3 steps (--steps)" in result.stderr


def test_a_guarded_module_keeps_its_own_guard(tmp_path):
    # @shapeguard.guard raises at the buggy line under python; it must under run too.
    guarded = BUGGY.replace(
        "class Attention(nn.Module):", "@shapeguard.guard(strict=True)\nclass Attention(nn.Module):"
    )
    script = write(tmp_path, "guarded.py", "import shapeguard\n" + guarded)
    env = dict(os.environ, PYTHONPATH=ROOT)
    plain = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, env=env, timeout=120
    )
    result = run(script)
    assert plain.returncode == result.exit_code == 1
    assert plain.stdout == result.stdout == ""
    assert (
        "shapeguard.ShapeError: q(x).view(3, 4, 7, 16): carves heads out of the seq axis"
        in plain.stderr
    )
    assert (
        "shapeguard.ShapeError: q(x).view(3, 4, 7, 16): carves heads out of the seq axis"
        in result.stderr
    )
    # The guard's finding comes back to the report.
    assert "1 module traced, 1 finding; exit status 1" in result.stderr
