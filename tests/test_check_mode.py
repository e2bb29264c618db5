"""`check` on a module left in train mode, as every module is after construction (issue 30).

The probes run the module in eval mode, whatever way its dropout is reached (a Dropout
module, `F.dropout(training=self.training)`, SDPA's `dropout_p`, a Dropout called through a
closure over the original module, as minGPT's `mlpf` lambda does), say so under the table
and in the JSON, and leave the module in the mode it was given in, also when a probe
raises. Dropout that eval mode does not turn off runs from one RNG state per probe run.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from shapeguard._cli.commands import cli
from shapeguard._probes.check import check

pytestmark = pytest.mark.no_shapeguard

# batch, heads, seq, d_k: pairwise distinct; batch == heads == seq == d_k; realistic.
SIZES = {
    "distinct": (3, 4, 7, 16),
    "coincident": (4, 4, 4, 4),
    "realistic": (4, 8, 64, 64),
}
P = 0.3


class Block(nn.Module):
    """A causal pre-norm block with dropout reached one way (`how`): "module" (nn.Dropout on
    the attention output), "functional" (F.dropout with training=self.training), "sdpa"
    (SDPA's dropout_p when training, as nanoGPT), "closure" (minGPT's lambda over the
    original module's Dropout), "always" (SDPA's dropout_p whatever the mode)."""

    def __init__(self, heads, d_k, how):
        super().__init__()
        d = heads * d_k
        self.h, self.how = heads, how
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.drop = nn.Dropout(P)
        self.mlp = nn.ModuleDict(dict(fc=nn.Linear(d, 2 * d), out=nn.Linear(2 * d, d)))
        self.mlp["dropout"] = nn.Dropout(P)
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.out(F.gelu(m.fc(x))))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (
            t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2)
        )
        p = {"sdpa": P if self.training else 0.0, "always": P}.get(self.how, 0.0)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = self.proj(y.transpose(1, 2).reshape(B, T, C))
        if self.how == "module":
            y = self.drop(y)
        elif self.how == "functional":
            y = F.dropout(y, P, training=self.training)
        x = x + y
        return x + self.mlpf(x) if self.how == "closure" else x


def built(size, how):
    _, h, _, dk = SIZES[size]
    torch.manual_seed(0)
    return Block(h, dk, how)


def data(size):
    b, h, s, dk = SIZES[size]
    torch.manual_seed(1)
    return torch.randn(b, s, h * dk)


def statuses(report):
    return {r.name: r.status for r in report.results}


@pytest.mark.parametrize("how", ["module", "functional", "sdpa", "closure"])
@pytest.mark.parametrize("size", SIZES)
def test_dropout_in_train_mode_fails_no_probe(size, how):
    model = built(size, how)
    assert model.training
    report = check(model, data(size))
    got = statuses(report)
    assert report.failed == [], report.render(width=200)
    assert got["causality"] == "passed", report.render(width=200)
    assert got["batch independence"] == "passed", report.render(width=200)
    assert all(m.training for m in model.modules())  # left as it was given


@pytest.mark.parametrize("size", ["distinct", "coincident"])
def test_dropout_that_eval_mode_keeps_fails_no_probe(size):
    """SDPA's dropout_p passed whatever the mode: random in eval mode too; every probe run
    starts from one RNG state, and what the draws still move is no counterexample."""
    model = built(size, "always")
    report = check(model, data(size))
    assert report.failed == [], report.render(width=200)
    assert statuses(report)["batch independence"] == "passed"


def test_the_table_and_the_json_say_the_probes_ran_in_eval_mode():
    model = built("distinct", "module")
    report = check(model, data("distinct"))
    lines = report.render(width=300).splitlines()
    below = next(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[-1] == "11 checks in float64: 7 passed, 4 n/a; passed"
    assert lines[below + 1] == (
        "mode: the probes ran the module in eval mode (dropout off); it was given in "
        "train mode and is left so"
    )
    assert report.to_dict()["mode"] == {
        "given": "train",
        "probed": "eval",
        "training_modules": 8,
        "modules": 8,
    }


def test_a_partly_trained_module_is_counted_and_a_module_in_eval_mode_gets_no_line():
    model = built("distinct", "module")
    model.mlp.train(False)
    report = check(model, data("distinct"))
    assert report.mode_line() == (
        "mode: the probes ran the module in eval mode (dropout off); it was given in "
        "train mode (4 of its 8 modules) and is left so"
    )
    assert report.to_dict()["mode"]["given"] == "mixed"
    assert model.training and not model.mlp.dropout.training  # each module as it was
    model.eval()
    report = check(model, data("distinct"))
    assert report.mode_line() == ""
    assert "mode:" not in report.render(width=300)
    assert report.to_dict()["mode"] == {
        "given": "eval",
        "probed": "eval",
        "training_modules": 0,
        "modules": 8,
    }
    assert not any(m.training for m in model.modules())


class Raises(Block):
    """Raises from its forward on the second call: a probe run, after the trace."""

    calls = 0

    def forward(self, x):
        type(self).calls += 1
        if type(self).calls > 1:
            raise KeyboardInterrupt  # not an Exception: nothing inside check catches it
        return super().forward(x)


def test_the_mode_is_restored_when_the_check_is_interrupted():
    torch.manual_seed(0)
    model = Raises(4, 16, "closure")
    with pytest.raises(KeyboardInterrupt):
        check(model, data("distinct"))
    assert all(m.training for m in model.modules())


MINGPT_BLOCK = """
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d=48, h=3, p=0.1):
        super().__init__()
        self.qkv, self.proj, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), h
        self.mlp = nn.ModuleDict(
            dict(fc=nn.Linear(d, 4 * d), out=nn.Linear(4 * d, d), dropout=nn.Dropout(p))
        )
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.out(F.gelu(m.fc(x))))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlpf(x)
"""


def test_the_command_line_says_the_mode_under_the_table_and_in_the_json(tmp_path):
    """minGPT's block as built (repro-real-repositories/dropout_in_closure.py): exit 0."""
    path = tmp_path / "block.py"
    path.write_text(MINGPT_BLOCK)
    got = CliRunner().invoke(cli, ["check", str(path)], env={"COLUMNS": "200"})
    assert got.exit_code == 0, (got.stdout, got.stderr)
    lines = got.stdout.splitlines()
    below = next(i for i, line in enumerate(lines) if line.startswith("└"))
    assert lines[-1] == "11 checks: 7 passed, 4 n/a; passed"
    assert lines[below + 1] == (
        "mode: the probes ran the module in eval mode (dropout off); it was given in "
        "train mode and is left so"
    )
    got = CliRunner().invoke(cli, ["check", str(path), "--json", "-"])
    assert got.exit_code == 0, (got.stdout, got.stderr)
    probes = json.loads(got.stdout)["check"]["probes"]
    assert probes["mode"] == {
        "given": "train",
        "probed": "eval",
        "training_modules": 7,
        "modules": 7,
    }
    assert probes["counts"]["failed"] == 0
