"""Several ranks, one report: `shapeguard merge`, the per-rank output helpers (`_ranks`),
and what a rank other than rank 0 prints. Pure Python, no process group."""

import json

import pytest
from click.testing import CliRunner

from shapeguard import _merge, _ranks
from shapeguard._cli.commands import cli


def _finding(relation: str, *, kind="tp_head_divisibility", operands=()) -> dict:
    return {
        "kind": kind,
        "severity": "error",
        "message": f"{relation}\n  in  wk (Linear) at model.py:25\n  hint: tp degrees that work: 1, 2",
        "relation": relation,
        "op": "linear",
        "module": "wk (Linear)",
        "location": "model.py:25",
        "source": "xk = self.wk(x)",
        "operands": [{"name": n, "shape": s} for n, s in operands],
        "hint": "tp degrees that work: 1, 2",
        "event_index": 3,
    }


def _report(rank: int, world: int, findings=(), events=()) -> dict:
    return {
        "schema": "shapeguard.trace",
        "schema_version": 2,
        "events": list(events),
        "findings": list(findings),
        "distributed": {"rank": rank, "world_size": world},
    }


def _event(index: int, shape: list[int]) -> dict:
    return {
        "index": index,
        "op": "linear",
        "location": "model.py:24",
        "outputs": [{"shape": [3, 5, 192], "local_shape": shape}],
    }


def test_findings_are_grouped_by_the_ranks_that_hit_them():
    same = _finding("n_kv_heads=4 is not divisible by tp=3")
    reports = {r: _report(r, 3, [same]) for r in range(3)}
    merged = _merge.merge(reports)
    (group,) = merged.groups
    assert group.ranks == [0, 1, 2]
    text = _merge.render(merged)
    assert "error tp_head_divisibility on all 3 ranks: wk (Linear) at model.py:25" in text
    assert text.count("n_kv_heads=4 is not divisible by tp=3") == 1  # once, not per rank
    assert text.endswith("1 error, 0 warnings across all 3 ranks\n")


def test_differing_messages_and_shapes_are_shown_per_rank():
    reports = {
        0: _report(
            0, 3, [_finding("a 22", operands=[("x", "[3, 5, 22]")])], [_event(0, [3, 5, 22])]
        ),
        1: _report(1, 3, [], [_event(0, [3, 5, 22])]),
        2: _report(
            2, 3, [_finding("a 20", operands=[("x", "[3, 5, 20]")])], [_event(0, [3, 5, 20])]
        ),
    }
    merged = _merge.merge(reports)
    text = _merge.render(merged)
    assert "on ranks 0, 2: wk (Linear) at model.py:25" in text
    assert "  on rank 2: a 20\n    x  [3, 5, 20]" in text
    assert (
        "#0 linear at model.py:24: rank 0 [3, 5, 22] | rank 1 [3, 5, 22] | rank 2 [3, 5, 20]"
        in text
    )
    assert "no finding on rank 1" in text


def test_a_simulated_rank_stands_for_the_ranks_with_its_shard_sizes():
    merged = _merge.merge({0: _report(0, 4, [_finding("r")])}, also={0: [1, 2, 3]})
    assert merged.groups[0].ranks == [0, 1, 2, 3]
    assert merged.ranks == [0, 1, 2, 3]


def test_ranks_text_names_runs():
    assert _merge.ranks_text([0, 1, 2, 5], 8) == "ranks 0-2, 5"
    assert _merge.ranks_text([0, 1], 2) == "all 2 ranks"
    assert _merge.ranks_text([3], 4) == "rank 3"


def test_merge_command_reads_the_rank_files(tmp_path):
    paths = []
    for r in range(2):
        path = tmp_path / f"trace.rank{r}.json"
        path.write_text(json.dumps(_report(r, 2, [_finding("n_kv_heads=3 at tp=2")])))
        paths.append(str(path))
    result = CliRunner().invoke(cli, ["merge", *paths])
    assert result.exit_code == 1, result.output
    assert "shapeguard merge: 2 ranks of 2" in result.output
    assert "on all 2 ranks: wk (Linear) at model.py:25" in result.output


def test_merge_command_refuses_what_is_not_a_trace_report(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"schema": "something else"}')
    result = CliRunner().invoke(cli, ["merge", str(path)])
    assert result.exit_code == 2
    assert "is not a shapeguard trace report (--json)" in result.output
    twice = tmp_path / "r0.json"
    twice.write_text(json.dumps(_report(0, 2)))
    result = CliRunner().invoke(cli, ["merge", str(twice), str(twice)])
    assert result.exit_code == 2 and "is rank 0's report, as is another given" in result.output


# -- _ranks: what one rank of a torchrun job prints and writes -------------------------------
@pytest.fixture
def rank_one_of_two(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("SHAPEGUARD_RANKS", raising=False)


def test_one_rank_prefixes_its_lines_and_leaves_the_tables_to_rank_0(rank_one_of_two, monkeypatch):
    assert _ranks.prefixed("a\nb\n") == "[rank 1/2] a\n[rank 1/2] b\n"
    assert not _ranks.shows_full_report()
    monkeypatch.setenv("SHAPEGUARD_RANKS", "all")
    assert _ranks.shows_full_report()
    monkeypatch.setenv("SHAPEGUARD_RANKS", "0,1")
    assert _ranks.shows_full_report()


def test_report_paths_get_the_rank(rank_one_of_two):
    assert _ranks.rank_path("trace.json") == "trace.rank1.json"
    assert _ranks.rank_path("out/{rank}/trace.json") == "out/1/trace.json"
    assert _ranks.rank_path("report") == "report.rank1"


def test_a_single_process_run_is_left_alone(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert _ranks.prefix() == "" and _ranks.shows_full_report()
    assert _ranks.rank_path("trace.json") == "trace.json"
    assert _ranks.rank_path("t.{rank}.json") == "t.0.json"


def test_tp_option_refuses_bad_degrees_and_report_files():
    model = "tests/cli_models/tp_llama.py"
    result = CliRunner().invoke(cli, ["trace", model, "--tp", "0,2"])
    assert result.exit_code == 2
    assert "--tp 0,2: give a tp degree or a list of them, e.g. --tp 2 or 1,2,4,8" in result.output
    result = CliRunner().invoke(cli, ["trace", model, "--tp", "2", "--json", "t.json"])
    assert result.exit_code == 2
    assert "--tp prints a text report only" in result.output


@pytest.mark.no_shapeguard
def test_a_warning_on_one_rank_says_which(rank_one_of_two):
    import warnings

    import torch

    import shapeguard
    from shapeguard import ShapeWarning

    class Attention(torch.nn.Module):
        def forward(self, x):  # self-attention: the queries are the keys
            scores = x @ x.transpose(-2, -1)
            return scores.softmax(dim=-2)  # over the queries: a silent bug

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ShapeWarning)
        shapeguard.trace(Attention(), torch.randn(2, 3, 5, 16))
    (warning,) = [w.message for w in caught if isinstance(w.message, ShapeWarning)]
    assert warning.kind == "softmax_axis"
    assert str(warning).startswith("[rank 1/2] ")
