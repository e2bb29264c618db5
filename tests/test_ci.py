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
    assert "-c constraints/test.txt" in test_command, (
        "the test command installs the pinned versions"
    )
    assert test_command.endswith("python -m pytest -n auto"), "the suite runs in parallel"


def test_the_newest_release_command_is_the_readmes():
    """The second documented command (the suite against the newest releases) is the one
    `.ci/newest` runs, and it tests the newest torch the README names."""
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```text\n(pip install torch==.*?)\n```", readme, re.S)
    assert len(commands) == 1, "the README gives the newest-release command once"
    newest = commands[0].strip()
    assert "--upgrade" in newest and "pytest" in newest and "constraints" not in newest
    torch_pin = re.match(r"pip install (torch==[\d.]+)", newest).group(1)
    assert newest.count(torch_pin) == 2, "torch stays at the tested release while the rest upgrades"
    assert newest.endswith("python -m pytest -n auto"), "the suite runs in parallel"
    assert newest in (ROOT / ".ci" / "newest").read_text().splitlines()
    assert torch_pin.split("==")[1] in readme.split("Tested:", 1)[1].split("\n\n", 1)[0]


def test_the_constraints_pin_every_test_dependency_exactly():
    """A fresh machine resolves what CI resolved: every package of the test group, and torch,
    has an exact pin in constraints/test.txt, and torch's pin is the README's."""
    import tomllib

    pins = {}
    for line in (ROOT / "constraints" / "test.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pins[name.lower().replace("_", "-")] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = [*project["project"]["dependencies"], *project["dependency-groups"]["test"]]
    for spec in declared:
        name = re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in constraints/test.txt"
    assert pins["torch"] == "2.13.0"


def test_the_suite_dogfoods_the_plugin_strictly():
    """Every test runs inside a trace and a ShapeWarning fails it, so a false warning on
    the project's own code cannot pass; tests that warn on purpose opt out by marker."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert ini["shapeguard"] is True
    assert ini["shapeguard_strict"] is True
    assert "error" in ini["filterwarnings"]


def test_every_module_the_tests_import_is_installed_by_the_test_group():
    """A fresh CI machine installs only the project and its `test` group: a test module
    importing anything else fails collection there while passing on a developer's machine."""
    import ast
    import sys
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = [*project["project"]["dependencies"], *project["dependency-groups"]["test"]]
    installed = {
        re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower().replace("-", "_") for spec in declared
    }
    optional = {"flash_attn", "torchinfo", "mypy"}  # imported only behind find_spec/importorskip
    local = {path.stem for path in (ROOT / "tests").rglob("*.py")} | {
        "shapeguard",
        "examples",
        "bench",
    }
    local |= {path.stem for path in (ROOT / "examples").glob("*.py")} | {
        path.stem for path in (ROOT / "bench").glob("*.py")
    }
    missing = {}
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in local or top in optional:
                    continue
                if top not in installed:
                    missing.setdefault(top, path.name)
    assert not missing, f"imported by tests but not in the test group: {missing}"


def test_the_wheel_ships_the_typed_marker():
    """PEP 561: `shapeguard/py.typed` tells a user's type checker to read the package's
    annotations. Hatch's wheel takes every file under `packages`, the marker included."""
    import tomllib

    assert (ROOT / "shapeguard" / "py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "shapeguard" in wheel["packages"]
    assert not any("py.typed" in str(pattern) for pattern in wheel.get("exclude", []))


def test_ci_type_checks_the_package():
    """CI runs mypy over the package (configured in pyproject), after the tests; mypy is a
    dev tool, not in the test group."""
    import tomllib

    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert 'pip install "mypy>=1.11" -c constraints/test.txt && mypy' in ci
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mypy = project["tool"]["mypy"]
    assert mypy["files"] == ["shapeguard"] and mypy["check_untyped_defs"] is True
    dev = project["dependency-groups"]["dev"]
    assert any(isinstance(spec, str) and spec.startswith("mypy") for spec in dev)
    assert not any(spec.startswith("mypy") for spec in project["dependency-groups"]["test"])


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints" / "test.txt").read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if version:
            pins[name.lower().replace("_", "-")] = version
    return pins


def test_parallel_runs_come_from_the_test_group():
    """`-n auto` is pytest-xdist's: the test group installs it, at the pinned version."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(spec.startswith("pytest-xdist") for spec in project["dependency-groups"]["test"])
    assert "pytest-xdist" in _pins()


def test_ci_runs_ruff_and_its_format_check():
    """CI lints and checks the formatting of the whole tree at the pinned ruff, which the dev
    group declares; markdown is left out of formatting on purpose (pyproject says why)."""
    import tomllib

    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert (
        'pip install "ruff>=0.6" -c constraints/test.txt && ruff check . && ruff format --check .'
        in ci
    )
    assert "ruff" in _pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert any(
        isinstance(spec, str) and spec.startswith("ruff")
        for spec in project["dependency-groups"]["dev"]
    )
    assert "*.md" in project["tool"]["ruff"]["format"]["exclude"]


def test_one_documented_command_regenerates_every_golden_file():
    """docs/contributing.md gives one command that rewrites all the text the tests compare
    byte for byte; it names every test file that can rewrite such text, and runs serially
    (the catalogue's tests rewrite docs/errors.md one block at a time)."""
    page = (ROOT / "docs" / "contributing.md").read_text()
    commands = [line for line in page.splitlines() if line.startswith("SHAPEGUARD_REGEN=1 ")]
    assert len(commands) == 1, commands
    named = set(re.findall(r"tests/(test_\w+\.py)", commands[0]))
    rewriters = {
        path.name
        for path in (ROOT / "tests").glob("test_*.py")
        if re.search(r"\b(check_golden|regen_enabled)\(", path.read_text())
    }
    assert named == rewriters
    assert " -n" not in commands[0]
    assert "ruff check . && ruff format --check ." in page


def test_the_contributing_page_is_in_the_docs_nav():
    assert "  - Contributing: contributing.md" in (ROOT / "mkdocs.yml").read_text().splitlines()


def test_ci_tests_the_built_wheel_from_a_fresh_virtualenv():
    """After the suite, .ci/run builds the sdist and the wheel and hands them to .ci/wheel,
    which installs the wheel (torch first) into a fresh virtualenv and, from a temporary
    folder, runs the README's first command's trace, the smoke test, --version and the
    plugin's options. The step cannot vanish without this test failing."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert 'pip install "twine>=6" -c constraints/test.txt && .ci/wheel' in ci
    script = ROOT / ".ci" / "wheel"
    assert script.stat().st_mode & 0o111, ".ci/wheel is executable"
    lines = [line.split("#", 1)[0].strip() for line in script.read_text().splitlines()]
    readme = (ROOT / "README.md").read_text()
    first = re.findall(r"```bash\n(.*?)\n```", readme, re.S)[0].strip()
    trace = first.split(" && ")[-1]
    assert trace.startswith("shapeguard trace examples/")
    assert trace in lines, f"the README's trace, verbatim: {trace}"
    order = [
        "python -m build --no-isolation --outdir dist . && twine check --strict dist/*",
        'cd "$work"',
        "unset PYTHONPATH",
        "python3 -m venv venv",
        'pip install torch==2.13.0 && pip install "$wheel" pytest -c "$constraints"',
        trace,
        "python smoke.py",
        "shapeguard --version",
        'python -m pytest --help | grep -- "--shapeguard-strict"',
    ]
    assert [lines.index(line) for line in order] == sorted(lines.index(line) for line in order)
    assert "set -euo pipefail" in lines
    assert (ROOT / ".ci" / "smoke.py").is_file()


def test_the_release_workflow_tests_and_publishes_the_built_files():
    """A version tag builds, checks (twine), tests the built wheel with .ci/wheel, and only
    then publishes by trusted publishing, from an environment, with an identity token."""
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert re.search(r"^on:\n  push:\n    tags: \[\"v\*\"\]$", workflow, re.M)
    jobs = workflow.split("\njobs:\n", 1)[1]
    build, test, publish = _jobs(jobs)
    assert "python -m build --outdir dist ." in build and "twine check --strict dist/*" in build
    assert "shapeguard/_version.py" in build and "CHANGELOG.md" in build
    assert "needs: build" in test and ".ci/wheel dist/*.whl" in test
    assert "needs: [build, test]" in publish
    assert "uses: pypa/gh-action-pypi-publish@release/v1" in publish
    assert "id-token: write" in publish and "environment:" in publish
    assert "password" not in publish and "secrets." not in workflow  # no stored token
    assert "  - Releasing: release.md" in (ROOT / "mkdocs.yml").read_text().splitlines()
    assert "docs/release.md" in (ROOT / "README.md").read_text()
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and "keepachangelog.com" in changelog


def _jobs(text: str) -> tuple[str, str, str]:
    """The build, test and publish jobs' texts, in that order."""
    parts = re.split(r"^  (\w+):\n", text, flags=re.M)
    named = dict(zip(parts[1::2], parts[2::2], strict=True))
    assert list(named) == ["build", "test", "publish"], list(named)
    return named["build"], named["test"], named["publish"]
