"""Each `examples/bug_*.py` shows, in its docstring, the message shapeguard prints for it.

The block after "shapeguard says:" must equal what tracing the example prints
now; SHAPEGUARD_REGEN=1 rewrites the blocks (then review the diff).
"""

import pathlib
import re

import pytest
from _docs_support import capture_messages, forget_source, regen_enabled, run_example

# These tests provoke shape violations on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUGS = sorted((ROOT / "examples").glob("bug_*.py"))
CLASSIC = (
    "heads_not_divisible",
    "k_not_transposed",
    "linear_width",
    "mask_shape",
    "view_after_transpose",
    "wrong_head_split",
    "merge_without_transpose",
    "causal_leak",
    "batch_first",
    "sdpa_layout",
)
# The indented block after "shapeguard says:", up to the next unindented line.
_BLOCK = re.compile(r"(shapeguard says:\n\n)((?:    .*\n|\n)+?)(?=\S)")


def documented(text: str) -> str:
    match = _BLOCK.search(text)
    assert match is not None, "no 'shapeguard says:' block followed by an indented message"
    lines = match.group(2).rstrip("\n").split("\n")
    return "\n".join(line[4:] for line in lines)


def rewrite(text: str, message: str) -> str:
    block = "\n".join(f"    {line}" if line else "" for line in message.split("\n")) + "\n\n"
    return _BLOCK.sub(lambda m: m.group(1) + block, text, count=1)


def test_every_classic_bug_has_an_example():
    names = {path.stem.removeprefix("bug_") for path in BUGS}
    assert set(CLASSIC) <= names, f"missing: {sorted(set(CLASSIC) - names)}"


@pytest.mark.parametrize("path", BUGS, ids=lambda p: p.stem)
def test_docstring_shows_the_real_message(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # locations in messages are relative to the working directory
    run = run_example(str(path.relative_to(ROOT)))
    actual = capture_messages(run)
    text = path.read_text()
    # A longer block moves the code below it, and the message names its line:
    # rewrite until the block and the message agree.
    for _ in range(3 if regen_enabled() else 0):
        if documented(text) == actual:
            break
        path.write_text(rewrite(text, actual))
        text = path.read_text()
        forget_source(str(path))
        actual = capture_messages(run)
    assert documented(text) == actual, (
        f"{path.name}: run with SHAPEGUARD_REGEN=1 and review the diff"
    )


def test_block_parser_round_trips():
    text = '"""Bug.\n\nshapeguard says:\n\n    old\n\n    more\n\nThe fix.\n"""\n'
    new = rewrite(text, "a\n  b\n\nc")
    assert documented(new) == "a\n  b\n\nc"
    assert new.endswith('\n    c\n\nThe fix.\n"""\n')
