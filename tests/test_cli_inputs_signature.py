"""Inputs for forwards that take `*args` and keyword-only flags (issue 30): DINOv2's
`forward(*args, is_training=False)` got a tensor for `is_training`, and a `forward(*args)`
could not be given a positional input at all."""

import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard

ATTENTION = """
import torch
import torch.nn.functional as F
from torch import nn


class Blocks(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.q, self.kv, self.h = nn.Linear(d, d), nn.Linear(d, 2 * d), heads

    def attend(self, x, context=None):
        context = x if context is None else context
        B, T, C = x.shape
        S = context.shape[1]
        q = self.q(x).view(B, T, self.h, C // self.h).transpose(1, 2)
        k, v = (
            t.view(B, S, self.h, C // self.h).transpose(1, 2) for t in self.kv(context).split(C, 2)
        )
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
"""


def write(tmp_path, forward: str):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(ATTENTION) + textwrap.indent(textwrap.dedent(forward), "    "))
    return path


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line_error(result, text: str) -> str:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert text in lines[0], lines[0]
    return lines[0]


DINO = """
def forward(self, *args, is_training=False):
    if not isinstance(is_training, bool):
        raise TypeError(f"is_training is a {type(is_training).__name__}")
    out = self.attend(*args)
    return {"x": out} if is_training else out
"""


def test_a_keyword_only_flag_gets_no_tensor_and_args_take_positional_inputs(tmp_path):
    path = write(tmp_path, DINO)
    one_line_error(
        run("trace", path),
        "cannot tell what Blocks.forward(*args, is_training=...) takes: pass --input "
        "args=SIZES (repeated for each positional input, in order)",
    )
    one_line_error(
        run("trace", path, "--input", "x=2,5,32"),
        "has no parameter 'x'; name one of: args (its positional inputs, in order: repeat "
        "--input args=SIZES)",
    )
    result = run("trace", path, "--input", "args=2,5,32")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1] == (
        "inputs  args[0]=[2, 5, 32] float32  (from --input args)"
    )
    assert "0 errors, 0 warnings" in result.stdout


def test_args_repeated_are_the_positional_inputs_in_order(tmp_path):
    path = write(
        tmp_path,
        """
        def forward(self, *args):
            x, context = args
            if (x.shape[1], context.shape[1]) != (5, 7):
                raise ValueError("the positional inputs came out of order")
            return self.attend(x, context)
        """,
    )
    result = run("trace", path, "--input", "args=2,5,32", "--input", "args=2,7,32")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1] == (
        "inputs  args[0]=[2, 5, 32] float32, args[1]=[2, 7, 32] float32  (from --input args)"
    )
    assert "0 errors, 0 warnings" in result.stdout


def test_a_flag_of_an_all_optional_forward_is_never_the_made_up_input(tmp_path):
    path = write(
        tmp_path,
        """
        def forward(self, use_cache=False, x=None):
            if use_cache is not False:
                raise TypeError("use_cache got a tensor")
            return self.attend(x)
        """,
    )
    result = run("trace", path)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1].startswith("inputs  x=[2, 5, 32] float32")


def test_a_name_given_twice_is_refused_unless_it_is_args(tmp_path):
    path = write(tmp_path, "def forward(self, x):\n    return self.attend(x)\n")
    one_line_error(
        run("trace", path, "--input", "x=2,5,32", "--input", "x=2,7,32"),
        "--input x is given twice; give it once",
    )
