"""The CLI's trace table and JSON, byte for byte against golden files (fixed width, no
colour). Regenerate with SHAPEGUARD_REGEN=1 and review the diff."""

import json
import pathlib

import pytest
from _golden import check_golden
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard

ROOT = pathlib.Path(__file__).resolve().parent.parent
# A clean model, and one with an error and the table of what ran before it.
EXAMPLES = ["seed_mha", "bug_mask_shape", "bug_k_not_transposed", "bug_batch_first"]


def _run(args: list[str], monkeypatch) -> tuple[int, str]:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    return result.exit_code, result.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_trace_table(example, monkeypatch):
    code, out = _run(["trace", f"examples/{example}.py"], monkeypatch)
    check_golden(f"trace_{example}.txt", f"exit {code}\n{out}")


@pytest.mark.parametrize("example", ["seed_mha", "bug_k_not_transposed"])
def test_trace_json(example, monkeypatch, tmp_path):
    target = tmp_path / "trace.json"
    code, _ = _run(["trace", f"examples/{example}.py", "--json", str(target)], monkeypatch)
    report = json.loads(target.read_text())
    report["shapeguard_version"] = "<version>"  # the one field a release changes
    check_golden(f"trace_{example}.json", f"exit {code}\n{json.dumps(report, indent=2)}\n")
