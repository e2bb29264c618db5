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
