"""A finding that repeats at one source line across layers is reported once, with the
layers it fired in, in the text, `check`'s table, the JSON and the HTML (issue 30: one
line of a 12-layer model was printed 36 times). The trace keeps every finding.
"""

import json
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli
from shapeguard._errors import Finding, Operand
from shapeguard._trace.finding_groups import grouped

pytestmark = pytest.mark.no_shapeguard  # the model carries its bug on purpose


def finding(module, *, relation="q.reshape(3, 4, 7, 16): carves heads", line=16, kind="k"):
    return Finding(
        kind=kind,
        severity="warning",
        message=f"{relation}\n  in  {module} at m.py:{line}",
        module=module,
        location=f"m.py:{line}",
        relation=relation,
        source="q = q.reshape(B, h, T, d)",
        operands=(Operand("q", "[batch=3, seq=7, 64] float32"),),
        hint="split heads out of the feature axis",
    )


def test_repeats_in_numbered_layers_are_one_group_with_their_layers():
    findings = [finding(f"h.{i}.attn (Attention)") for i in (0, 1, 2, 3, 5, 7, 8, 9)]
    (group,) = grouped(findings)
    assert group.findings == findings
    assert group.where == "layers 0-3, 5, 7-9 (8 modules, h.N.attn (Attention))"
    assert group.message.splitlines() == [
        "q.reshape(3, 4, 7, 16): carves heads",
        "  in  layers 0-3, 5, 7-9 (8 modules, h.N.attn (Attention)) at m.py:16",
        "      q = q.reshape(B, h, T, d)",
        "  q      [batch=3, seq=7, 64] float32",
        "  hint: split heads out of the feature axis",
    ]
    data = group.to_dict()
    assert data["module"] == "h.0.attn (Attention)"  # the first, as before
    assert data["modules"] == [f.module for f in findings]
    assert data["count"] == 8
    assert data["message"] == group.message


def test_modules_that_are_not_one_set_of_layers_are_named():
    modules = ["encoder.0.attn (A)", "decoder.0.attn (A)", "decoder.1.cross (A)", "head (A)"]
    (group,) = grouped([finding(m) for m in modules])
    assert group.where == (
        "4 modules (encoder.0.attn (A), decoder.0.attn (A), decoder.1.cross (A) and 1 more)"
    )


def test_the_same_finding_twice_in_one_module_is_one_group_told_once():
    """A helper called for the queries and then the keys (a rotary applied after the heads
    transpose) makes the same finding at its line twice in one module: the same bug at the
    same call, shown once with its count."""
    findings = [finding("attn (A)"), finding("attn (A)")]
    (group,) = grouped(findings)
    assert group.findings == findings
    assert group.modules == ["attn (A)"]
    assert group.message == findings[0].message and group.headline == findings[0].headline
    assert group.to_dict()["count"] == 2


def test_findings_that_differ_in_more_than_their_module_stay_apart():
    findings = [
        finding("h.0.attn (A)"),
        finding("h.1.attn (A)", relation="q.reshape(3, 4, 9, 16): carves heads"),
        finding("h.2.attn (A)", line=17),
        finding("h.3.attn (A)", kind="other"),
        finding("h.4.attn (A)"),
    ]
    groups = grouped(findings)
    assert [g.modules for g in groups] == [
        ["h.0.attn (A)", "h.4.attn (A)"],
        ["h.1.attn (A)"],
        ["h.2.attn (A)"],
        ["h.3.attn (A)"],
    ]
    assert groups[1].message == findings[1].message  # alone: as the trace made it
    assert groups[1].to_dict()["modules"] == ["h.1.attn (A)"]


MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, 2)
        q = q.reshape(B, self.h, T, C // self.h)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.attn = Attention(d, h)

    def forward(self, x):
        return self.attn(x)


class Model(nn.Module):
    def __init__(self, n_layer=12, d={d}, h={h}):
        super().__init__()
        self.h = nn.ModuleList(Block(d, h) for _ in range(n_layer))

    def forward(self, x):
        for block in self.h:
            x = block(x)
        return x


def example_inputs():
    return (torch.randn({b}, {s}, {d}),)
"""
# batch, heads, seq, d_k: pairwise distinct. Not the realistic sizes: at [4, 48 or 64,
# 512] the trace names the carved axis `seq` in layer 0 and `seq_k` in layers 1-11, two
# relations and so two groups (layer 0, then "layers 1-11 (11 modules ...)"), a naming
# question of its own.
SIZES = {"distinct": (3, 4, 7, 16)}


@pytest.fixture(params=SIZES)
def model_file(request, tmp_path, monkeypatch):
    b, h, s, dk = SIZES[request.param]
    path = tmp_path / "layers.py"
    path.write_text(textwrap.dedent(MODEL.format(b=b, h=h, s=s, d=h * dk)))
    monkeypatch.chdir(tmp_path)  # locations are relative to the working directory
    return path.name, (b, h, s, dk)


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], env={"COLUMNS": "300"})


def test_trace_prints_a_finding_of_every_layer_once(model_file):
    path, (b, h, s, dk) = model_file
    got = run("trace", path)
    assert got.exit_code == 1, got.stderr
    lines = got.stdout.splitlines()
    count = next(line for line in lines if " ops in " in line)
    assert count.endswith(
        "0 errors, 12 warnings (1 shown: a finding repeated across layers or calls is shown once)"
    )
    warnings = [i for i, line in enumerate(lines) if line.startswith("warning: ")]
    assert len(warnings) == 1
    assert lines[warnings[0] + 1] == (
        "  in  layers 0-11 (12 modules, h.N.attn (Attention)) at layers.py:17"
    )
    assert lines[warnings[0] + 2] == "      q = q.reshape(B, self.h, T, C // self.h)"
    assert got.stderr == "shapeguard: 12 warnings in layers.py\n"


def test_the_json_has_one_finding_with_its_modules(model_file):
    path, _ = model_file
    got = run("trace", path, "--json", "-")
    data = json.loads(got.stdout)
    (only,) = data["findings"]
    assert only["kind"] == "view_mixes_axes"
    assert only["module"] == "h.0.attn (Attention)"
    assert only["modules"] == [f"h.{i}.attn (Attention)" for i in range(12)]
    assert only["count"] == 12
    assert "  in  layers 0-11 (12 modules, h.N.attn (Attention)) at layers.py:17" in (
        only["message"].splitlines()
    )


def test_check_gives_the_finding_one_row_with_its_layers(model_file):
    path, (b, h, s, dk) = model_file
    got = run("check", path)
    rows = [line for line in got.stdout.splitlines() if line.startswith("│ view_mixes_axes")]
    assert len(rows) == 1, got.stdout
    assert "(in layers 0-11 (12 modules, h.N.attn (Attention)))" in rows[0]


def test_the_html_lists_the_finding_once_and_keeps_every_anchor(model_file, tmp_path):
    path, _ = model_file
    page = tmp_path / "report.html"  # beside the model file
    run("trace", path, "--html", page)
    html = page.read_text()
    assert html.count('class="finding warning"') == 1
    assert all(f'id="finding-{n}"' in html for n in range(1, 13))
    assert "in  layers 0-11 (12 modules, h.N.attn (Attention)) at" in html
