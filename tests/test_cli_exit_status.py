"""Each row of docs/cli.md's exit-status table has a CLI test, and the malformed-contract row's
tests live here: a shape annotation that cannot be read is a mistake in the file, like a
syntax error (exit 2, one line naming its file and line), not the model crashing (exit 1).

The table is read from the docs, so a row added there without a test here fails
`test_every_exit_status_row_has_a_test`.
"""

import ast
import os
import re
import textwrap

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI_DOC = os.path.join(ROOT, "docs", "cli.md")

# Each case of the table, as docs/cli.md words it, and the tests that hold the CLI to it
# ("file::test"). The row's status is asserted by those tests.
ROW_TESTS = {
    (0, "clean"): ["test_cli.py::test_trace_seed_example_shows_attention_shapes"],
    (1, "a violation was found"): [
        "test_cli.py::test_forward_violation_exits_1_with_findings_after_the_table",
        "test_cli.py::test_a_warning_is_a_violation",
    ],
    (1, "the model crashed"): [
        "test_cli.py::test_model_crash_exits_1_without_traceback_unless_asked",
        "test_cli.py::test_constructor_crash_exits_1",
    ],
    (1, "a check failed"): ["test_cli.py::test_check_fails_on_a_finding"],
    (1, "`explain` knew no message in the text"): [
        "test_explain.py::test_cli_unknown_message_exits_1"
    ],
    (2, "missing file"): ["test_cli.py::test_missing_file"],
    (2, "syntax error in it"): ["test_cli.py::test_syntax_error_in_the_file"],
    (2, "no model or more than one"): [
        "test_cli.py::test_no_model",
        "test_cli.py::test_ambiguous_model",
    ],
    (2, "bad `--input` / `--arg` / `--dim`"): [
        "test_cli.py::test_bad_input",
        "test_cli.py::test_bad_arg",
        "test_cli.py::test_bad_dim",
    ],
    (2, "an input too large to make"): ["test_cli_users.py::test_sizes_too_large_are_one_line"],
    (2, "the file calling `sys.exit` while imported"): [
        "test_cli_users.py::test_a_script_that_exits_while_imported_is_a_usage_error_in_its_own_name"
    ],
    (2, "a malformed contract in it"): [
        "test_cli_exit_status.py::test_a_malformed_contract_is_a_usage_error_at_its_line",
        "test_cli_exit_status.py::test_a_contract_jaxtyping_cannot_read_is_a_usage_error_at_its_line",
        "test_cli_exit_status.py::test_a_symbolic_dim_nothing_binds_is_a_usage_error_at_the_forward",
        "test_cli_exit_status.py::test_check_names_a_malformed_contract_too",
    ],
    (130, "interrupted"): ["test_cli_users.py::test_ctrl_c_exits_130_with_one_line"],
}


def _split_top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator`s outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == separator and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _case(item: str) -> list[str]:
    """The cases one comma-separated item of a row names: the list in its parentheses
    when that is a list ("could not run as given (missing file, ...)"), else the item
    without its parenthetical remarks."""
    item = " ".join(item.split())
    item = re.sub(r"^or ", "", item).strip()
    listed = re.fullmatch(r"[^(]*\((.*)\)", item)
    if listed and len(_split_top_level(listed.group(1), ",")) > 1:
        return [c for part in _split_top_level(listed.group(1), ",") for c in _case(part)]
    return [re.sub(r"\s*\([^)]*\)", "", item).strip()]


def documented_rows() -> set[tuple[int, str]]:
    """(status, case) for every case of docs/cli.md's exit-status paragraph."""
    with open(CLI_DOC, encoding="utf-8") as f:
        text = f.read()
    paragraph = re.search(r"Exit status, for every command:(.*?)\n\n", text, re.DOTALL)
    assert paragraph is not None, "docs/cli.md lost its exit-status paragraph"
    # The diagnostics sentence after the table is not a row.
    body = paragraph.group(1).split("\nThe report goes to stdout")[0]
    rows = set()
    for status, cases in re.findall(r"\*\*(\d+)\*\*\s*(.*?)(?=;\s*\*\*\d+\*\*|$)", body, re.DOTALL):
        for item in _split_top_level(cases.strip().rstrip("."), ","):
            rows.update((int(status), case) for case in _case(item) if case)
    return rows


def _test_names(filename: str) -> set[str]:
    with open(os.path.join(ROOT, "tests", filename), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_the_docs_table_reads_as_its_rows():
    rows = documented_rows()
    assert (2, "a malformed contract in it") in rows
    assert (2, "bad `--input` / `--arg` / `--dim`") in rows
    assert (1, "`explain` knew no message in the text") in rows
    assert {status for status, _ in rows} == {0, 1, 2, 130}


def test_every_exit_status_row_has_a_test():
    rows = documented_rows()
    assert rows - set(ROW_TESTS) == set(), "rows of docs/cli.md's exit-status table with no test"
    assert set(ROW_TESTS) - rows == set(), "tests of rows docs/cli.md no longer lists"
    for tests in ROW_TESTS.values():
        for test in tests:
            filename, name = test.split("::")
            assert name in _test_names(filename), f"{test} is not a test any more"


# -- the malformed-contract row ------------------------------------------------------------


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def write(tmp_path, source: str, name: str = "model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def malformed_line(result) -> str:
    """A malformed contract: exit 2, nothing on stdout, one `shapeguard:` line on stderr."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("shapeguard: error: malformed contract at "), lines[0]
    return lines[0]


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


UNREADABLE_AXES = """
    import shapeguard
    from jaxtyping import Float
    from torch import Tensor, nn


    @shapeguard.guard
    class Attn(nn.Module):
        def __init__(self, d_model: int = 8):
            super().__init__()
            self.d_model = d_model
            self.proj = nn.Linear(d_model, d_model)

        def forward(
            self,
            x: Float[Tensor, "batch seq d_model)"],
        ) -> Float[Tensor, "batch seq d_model"]:
            return self.proj(x)
    """

# The same contract, guarded when the model is built rather than when the file is imported.
UNREADABLE_AXES_AT_BUILD = (
    UNREADABLE_AXES.replace("    @shapeguard.guard\n", "")
    + """
    def build_model():
        return shapeguard.guard(Attn())
    """
)

UNBOUND_IN_A_FUNCTION = """
    import shapeguard
    from jaxtyping import Float
    from torch import Tensor, nn


    @shapeguard.contract
    def pad(q: Float[Tensor, "b n+1"]) -> Float[Tensor, "b n"]:
        return q


    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.d_model = 4
            self.proj = nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x)
    """


@pytest.mark.parametrize(
    ("source", "at", "text"),
    [
        (
            UNREADABLE_AXES,
            'x: Float[Tensor, "batch seq d_model)"]',
            'Attn.forward: x: dim "d_model)" in "batch seq d_model)" is neither a name, a '
            "number nor an expression; separate axes with spaces",
        ),
        (
            UNREADABLE_AXES_AT_BUILD,
            'x: Float[Tensor, "batch seq d_model)"]',
            'Attn.forward: x: dim "d_model)" in "batch seq d_model)" is neither a name, a '
            "number nor an expression; separate axes with spaces",
        ),
        (
            UNBOUND_IN_A_FUNCTION,
            "def pad(",
            "pad: a symbolic dim uses n, which no earlier argument binds; name it in an "
            "earlier argument's annotation",
        ),
    ],
    ids=["guarded-class", "guarded-at-build", "contract-function"],
)
def test_a_malformed_contract_is_a_usage_error_at_its_line(tmp_path, monkeypatch, source, at, text):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, source)
    line = malformed_line(run("trace", path))
    assert line == f"shapeguard: error: malformed contract at model.py:{line_of(path, at)}: {text}"


def test_a_contract_jaxtyping_cannot_read_is_a_usage_error_at_its_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, UNREADABLE_AXES.replace("batch seq d_model)", "batch seq,d_model"))
    line = malformed_line(run("trace", path))
    at = line_of(path, 'x: Float[Tensor, "batch seq,d_model"]')
    assert line == (
        f"shapeguard: error: malformed contract at model.py:{at}: jaxtyping cannot read it: "
        "Axes should be separated with spaces, not commas"
    )


def test_a_symbolic_dim_nothing_binds_is_a_usage_error_at_the_forward(tmp_path, monkeypatch):
    # Known only at the first call, when the module's attributes could have bound it.
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path,
        """
        import shapeguard
        from jaxtyping import Float
        from torch import Tensor, nn


        @shapeguard.guard
        class Attn(nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = nn.Linear(8, 8)

            def forward(self, x: Float[Tensor, "batch seq 8"]) -> Float[Tensor, "batch seq+pad 8"]:
                return self.proj(x)
        """,
    )
    line = malformed_line(run("trace", path))
    assert line == (
        f"shapeguard: error: malformed contract at model.py:{line_of(path, 'def forward')}: "
        "Attn.forward: a symbolic dim uses pad, which no argument and no attribute of Attn "
        "binds; name it in an argument's annotation or set self.pad"
    )


def test_check_names_a_malformed_contract_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, UNREADABLE_AXES)
    line = malformed_line(run("check", path))
    assert f"model.py:{line_of(path, 'x: Float[Tensor')}: Attn.forward: x: dim" in line


def test_a_crash_in_the_models_own_code_is_still_a_crash(tmp_path):
    # Only jaxtyping refusing a subscript is a contract: the model's own ValueError is not.
    path = write(
        tmp_path,
        """
        from torch import nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.d_model = 4
                self.proj = nn.Linear(4, 4)

            def forward(self, x):
                raise ValueError("Axes should be separated with spaces, not commas")
        """,
    )
    result = run("trace", path)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr == "shapeguard: the model crashed in forward\n"
