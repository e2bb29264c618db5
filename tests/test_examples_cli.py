"""Every file in examples/ runs through `shapeguard trace` with the exit status it declares.

An example declares what `shapeguard trace` must do with it in comment lines:

    # shapeguard: expect exit 1        (default 0: no finding)
    # shapeguard: args --device meta   (extra command-line arguments, shell-quoted)

A bug example expects exit 1 and must say why on stdout; a clean one expects 0
and must leave stderr free of errors.
"""

import os
import re
import shlex

import pytest
from click.testing import CliRunner

from shapeguard._cli.commands import cli

pytestmark = pytest.mark.no_shapeguard  # these tests trigger violations on purpose

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
_EXPECT = re.compile(r"^#\s*shapeguard:\s*expect exit (\d+)\s*$", re.MULTILINE)
_ARGS = re.compile(r"^#\s*shapeguard:\s*args (.+)$", re.MULTILINE)


def declared(path: str) -> tuple[int, list[str]]:
    """(expected exit status, extra arguments) from the example's `# shapeguard:` lines."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    expect = _EXPECT.search(text)
    args = _ARGS.search(text)
    return (int(expect.group(1)) if expect else 0), (shlex.split(args.group(1)) if args else [])


def examples() -> list[str]:
    return sorted(
        name for name in os.listdir(EXAMPLES) if name.endswith(".py") and not name.startswith("_")
    )


@pytest.mark.parametrize("name", examples())
def test_example_traces_with_its_declared_exit_status(name):
    path = os.path.join(EXAMPLES, name)
    status, extra = declared(path)
    result = CliRunner().invoke(cli, ["trace", path, *extra])
    assert result.exit_code == status, (
        f"shapeguard trace examples/{name} exited {result.exit_code}, declared {status}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    assert "Traceback" not in result.stdout + result.stderr
    if status == 0:
        assert re.search(
            r"^\d+ ops in \d+ modules; 0 errors, 0 warnings$", result.stdout, re.MULTILINE
        )
        assert "shapeguard: error" not in result.stderr
    elif status == 1:
        assert re.search(r"^(error|warning): ", result.stdout, re.MULTILINE), result.stdout


def test_the_declaration_is_read():
    assert declared(os.path.join(EXAMPLES, "seed_mha.py")) == (0, [])
    assert _EXPECT.search("x = 1\n# shapeguard: expect exit 1\n").group(1) == "1"
    assert (
        _ARGS.search("# shapeguard: args --device meta --dim seq=7\n").group(1)
        == "--device meta --dim seq=7"
    )


def test_there_are_examples_of_both_kinds():
    statuses = {declared(os.path.join(EXAMPLES, name))[0] for name in examples()}
    assert statuses == {0, 1}
