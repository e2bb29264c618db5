"""Runnable examples in docstrings and in the README are executed, so they cannot drift."""

import doctest
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _modules_with_examples() -> list[str]:
    """Every module of the package whose source holds a `>>>` example."""
    package = ROOT / "shapeguard"
    found = []
    for path in sorted(package.rglob("*.py")):
        if ">>> " not in path.read_text():
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found():
    assert {"shapeguard._errors", "shapeguard._config", "shapeguard.report.text"} <= set(MODULES)


@pytest.mark.no_shapeguard
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.IGNORE_EXCEPTION_DETAIL
    result = doctest.testmod(module, optionflags=flags, verbose=False)
    assert result.attempted > 0, f"{name} has no runnable example"
    assert result.failed == 0


@pytest.mark.no_shapeguard
def test_readme_example_runs_and_says_what_the_readme_says(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## In 30 seconds\n\n```python\n(.*?)```", text, re.S).group(1)
    namespace: dict = {}
    # The README shows the two failing calls as comments; run them and compare.
    code = block.replace("MultiHeadAttention(d_model=512, n_heads=6)\n", "")
    code = code.split("model = MultiHeadAttention()\n")[0]
    # A real file, so shapeguard can read the source lines it names.
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    exec(compile(code, str(script), "exec"), namespace)
    shapeguard, torch = namespace["shapeguard"], namespace["torch"]
    with pytest.raises(shapeguard.ShapeError) as info:
        namespace["MultiHeadAttention"](d_model=512, n_heads=6)
    assert str(info.value).startswith(
        "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2)"
    )
    assert "head counts that work for d_model=512: 1, 2, 4, 8, 16, 32, 64, 128, 256" in text
    model = namespace["MultiHeadAttention"]()
    with pytest.raises(shapeguard.ShapeError) as info:
        model(torch.randn(2, 16, 512), mask=torch.ones(2, 16))
    first = str(info.value).splitlines()[0]
    assert first == (
        "scores.masked_fill(mask == 0, ...): scores.seq_q (16) and (mask == 0).batch (2) do not broadcast"
    )
    assert (
        "scores.masked_fill(mask == 0, ...): scores.seq_q (16) and\n#   (mask == 0).batch (2)"
        in text
    )
    trace = shapeguard.trace(model, torch.randn(2, 16, 512))
    assert trace.shape_of("scores") == (2, 8, 16, 16)


@pytest.mark.no_shapeguard
def test_the_async_server_example_prints_what_docs_guard_says(tmp_path, capsys):
    text = (ROOT / "docs" / "guard.md").read_text()
    section = text.split("### Tracing requests in an async server\n", 1)[1]
    code, printed = re.search(
        r"```python\n(.*?)```\n\nprints\n\n```text\n(.*?)```", section, re.S
    ).groups()
    script = tmp_path / "async_server.py"
    script.write_text(code)
    exec(compile(code, str(script), "exec"), {"__name__": "async_server"})
    assert capsys.readouterr().out == printed
