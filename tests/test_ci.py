"""CI runs exactly the README's test command."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert len(commands) == 2, "the README has exactly two set-up commands"
    test_command = commands[1].strip()
    assert "pytest" in test_command and test_command.startswith("pip install torch==2.13.0")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci


def test_the_suite_dogfoods_the_plugin_strictly():
    """Every test runs inside a trace and a ShapeWarning fails it, so a false warning on
    the project's own code cannot pass; tests that warn on purpose opt out by marker."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["shapeguard"] is True
    assert ini["shapeguard_strict"] is True
    assert "error" in ini["filterwarnings"]
