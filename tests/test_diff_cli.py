"""`shapeguard diff`: exit statuses (0 agree, 1 divergence, 2 usage), the report on
stdout, the JSON and HTML files, the weights mapping file."""

import json
import textwrap

from click.testing import CliRunner

from shapeguard._cli.commands import cli

MODELS = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {root!r})
    import diff_models as dm

    def build_model():
        torch.manual_seed({seed})
        return {build}

    def example_inputs():
        return (torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(0)),)
    """
)


def _file(tmp_path, name: str, build: str, seed: int = 0):
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = tmp_path / name
    path.write_text(MODELS.format(root=root, seed=seed, build=build))
    return str(path)


def run(*args):
    return CliRunner().invoke(cli, ["diff", *map(str, args)])


def test_a_correct_port_exits_0_with_the_report(tmp_path):
    ref = _file(tmp_path, "ref.py", "dm.Attention(64, 4)")
    port = _file(tmp_path, "port.py", "dm.Port(64, 4)", seed=1)
    result = run(ref, port)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("diff: Port against Attention agree: 11 aligned tensors")
    assert "weights: 8 tensors copied from the reference (8 by shape)" in result.stdout


def test_a_divergence_exits_1_and_writes_json_and_html(tmp_path):
    ref = _file(tmp_path, "ref.py", "dm.Attention(64, 4)")
    port = _file(tmp_path, "port.py", "dm.Port(64, 4, scale_from_d_model=True)")
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"q_proj.weight": "wq.weight", "q_proj.bias": "wq.bias"}))
    out, page = tmp_path / "d.json", tmp_path / "d.html"
    result = run(ref, port, "--weights", mapping, "--json", out, "--html", page)
    assert result.exit_code == 1, result.output
    assert "  first divergence: scores (" in result.stdout
    assert "(2 by mapping, 6 by shape)" in result.stdout
    assert result.stderr.strip() == "shapeguard: Port diverges from Attention"
    data = json.loads(out.read_text())
    assert data["first"]["key"] == "scores" and data["agree"] is False
    assert data["first"]["port"]["source"].startswith("weights = torch.softmax(scores")
    assert 'class="diverge"' in page.read_text()


def test_json_to_stdout_holds_the_json_alone(tmp_path):
    ref = _file(tmp_path, "ref.py", "dm.Attention(64, 4)")
    port = _file(tmp_path, "port.py", "dm.SdpaAttention(64, 4)")
    result = run(ref, port, "--json", "-")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["agree"] is True and data["ref_only"] == ["scores", "attn"]


def test_usage_errors_exit_2_with_one_line(tmp_path):
    ref = _file(tmp_path, "ref.py", "dm.Attention(64, 4)")
    cases = {
        (ref,): "give PORT, or --backends / --dtype to compare REF with itself",
        (ref, "--backends", "eager"): "--backends eager: give two or more, separated by a comma",
        (ref, "--backends", "eager,sdpa"): "backends: Attention is not a transformers model",
        (ref, ref, "--weights", tmp_path / "none.json"): "--weights ",
        (tmp_path / "absent.py", ref): "no such file: ",
        (ref, "--dtype", "float32,nope"): "dtypes: 'nope' is not a torch dtype",
    }
    for args, message in cases.items():
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("shapeguard: error: "), lines
        assert message in lines[0]


def test_module_names_with_m(tmp_path, monkeypatch):
    (tmp_path / "ports").mkdir()
    (tmp_path / "ports" / "__init__.py").write_text("")
    _file(tmp_path / "ports", "ref.py", "dm.Attention(64, 4)")
    _file(tmp_path / "ports", "port.py", "dm.Port(64, 4, scale_from_d_model=True)")
    monkeypatch.chdir(tmp_path)
    result = run("-m", "ports.ref", "ports.port")
    assert result.exit_code == 1, result.output
    assert "  first divergence: scores (6 of 11 aligned tensors" in result.stdout


LLAMA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

def build_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager"))

def example_inputs():
    return (torch.randint(3, 100, (3, 7), generator=torch.Generator().manual_seed(0)),)
"""


def test_backends_and_dtypes_of_one_transformers_model(tmp_path):
    path = tmp_path / "llama.py"
    path.write_text(LLAMA)
    result = run(path, "--backends", "eager,sdpa")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "diff: LlamaForCausalLM[sdpa] against LlamaForCausalLM[eager] agree: 36 aligned"
    )
    result = run(path, "--dtype", "float32,bfloat16", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["port"] == "LlamaForCausalLM[bfloat16]"
    assert data["tolerance"] == {"atol": 0.05, "rtol": 0.1}


def test_the_json_schema_doc_lists_exactly_the_fields_written(tmp_path):
    import pathlib
    import re

    ref = _file(tmp_path, "ref.py", "dm.Attention(64, 4)")
    port = _file(tmp_path, "port.py", "dm.Port(64, 4, scale_from_d_model=True)")
    data = json.loads(run(ref, port, "--json", "-").stdout)
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "json-schema.md").read_text()
    section = doc.split("## DiffReport (the top-level object)")[1].split("\n## ")[0]
    documented = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)? \|", section, flags=re.MULTILINE))
    names = {name for pair in documented for name in pair if name}
    assert names == set(data)
    rest = doc.split("## Divergence (the `first` field)")[1]
    for field in (*data["first"], *data["first"]["ref"], *data["weights"]):
        assert f"`{field}`" in rest, field


def test_three_backends_one_line_per_pair_and_exit_1_when_one_diverges(tmp_path):
    model = _file(tmp_path, "model.py", "dm.Switchable(64, 4)")
    page = tmp_path / "d.html"
    result = run(
        model, "--backends", "eager,sdpa,d_model", "--json", tmp_path / "d.json", "--html", page
    )
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "diff: 2 backends against Switchable[eager]: 1 agree, 1 diverge"
    assert lines[1].startswith("  Switchable[sdpa]: agrees (9 aligned tensors within")
    assert lines[2].startswith("  Switchable[d_model]: diverges at scores: port == ref * 0.5")
    assert result.stderr.strip() == (
        "shapeguard: Switchable[d_model] diverges from Switchable[eager]"
    )
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["schema"] == "shapeguard.diff-set/1" and len(data["pairs"]) == 2
    # the page shows the pair that diverges, its scores marked
    assert '<tr class="diverge"><td>scores</td><td>scores</td>' in page.read_text()
    result = run(model, "--backends", "eager,sdpa,eager")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("diff: 2 backends against Switchable[eager]: 2 agree")
