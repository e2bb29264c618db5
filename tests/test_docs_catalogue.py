"""docs/errors.md catalogues every ShapeError/ShapeWarning kind, with real messages.

Each kind in the source has a section, a snippet `docs/snippets/<kind>.py` that the
page includes, and, after `<!-- message: <kind> -->`, the message that running the
snippet prints now. SHAPEGUARD_REGEN=1 rewrites the message blocks (review the diff).
"""

import pathlib
import re
import sys

import pytest
from _docs_support import (
    capture,
    regen_enabled,
    run_script,
    stand_in_flash_attn,
    stand_in_xformers,
)

# These tests provoke shape violations on purpose and assert on them.
pytestmark = pytest.mark.no_shapeguard

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "errors.md"
SNIPPETS = ROOT / "docs" / "snippets"
# The message runs to the first line that is only ``` (an empty block included: a new kind).
_BLOCK = re.compile(r"(<!-- message: (\w+) -->\n```text\n)(.*?)(\n?^```$)", re.S | re.M)
# Kinds whose snippet needs flash-attn's own kernel ops (torch.ops.flash_attn.*).
NEEDS_FLASH_KERNELS = {"flash_head_dim_multiple"}
# Kinds declared by a rule that no code yields yet, so no snippet can show them: the reach
# invariants (`checks/reach.py`) that `_reach.invariants.judge` does not judge yet: none now.
NOT_YET: set[str] = set()


def source_kinds() -> set[str]:
    """Every kind shapeguard can report: the registry's catalogue (rules declare the
    kinds they yield; the session, contracts and flash-attn declare theirs)."""
    from shapeguard.checks import kinds

    return set(kinds())


def page_blocks() -> dict[str, str]:
    return {m.group(2): m.group(3) for m in _BLOCK.finditer(PAGE.read_text())}


def test_the_catalogue_knows_each_kind_by_family_and_severity():
    from shapeguard.checks import kinds

    catalogue = kinds()
    assert catalogue["matmul_inner"].severities == {"error"}
    assert catalogue["softmax_axis"].severities == {"warning"}
    assert catalogue["torch_error"].families == {"session"}
    assert catalogue["layout_bshd"].families == {"flash", "layout"}


def test_every_kind_in_the_source_is_catalogued():
    kinds = source_kinds()
    assert {"matmul_inner", "torch_error", "contract", "mask_broadcast"} <= kinds
    blocks = page_blocks()
    assert kinds >= NOT_YET, f"not declared (drop them from NOT_YET): {sorted(NOT_YET - kinds)}"
    catalogued = sorted(NOT_YET & set(blocks))
    assert not catalogued, f"catalogued now (drop them from NOT_YET): {catalogued}"
    kinds -= NOT_YET
    missing = sorted(kinds - set(blocks))
    assert not missing, f"docs/errors.md has no entry for {missing}"
    no_snippet = sorted(k for k in kinds if not (SNIPPETS / f"{k}.py").exists())
    assert not no_snippet, f"no docs/snippets/<kind>.py for {no_snippet}"
    stale = sorted(set(blocks) - kinds)
    assert not stale, f"docs/errors.md catalogues kinds the source no longer has: {stale}"
    # Each kind has its own section, and its message block closes before the next one
    # (a block left open once swallowed five sections' headings and fixes).
    page = PAGE.read_text()
    no_heading = sorted(k for k in kinds if f"\n### `{k}`\n" not in page)
    assert not no_heading, f"docs/errors.md has no section heading for {no_heading}"
    unclosed = sorted(k for k, block in blocks.items() if "```" in block)
    assert not unclosed, f"message blocks that run into the next section: {unclosed}"


def test_the_readme_names_every_kind():
    readme = (ROOT / "README.md").read_text()
    missing = sorted(k for k in source_kinds() - NOT_YET if f"`{k}`" not in readme)
    assert not missing, f"README.md's kind table does not name {missing}"


def test_every_entry_includes_its_snippet():
    text = PAGE.read_text()
    for kind in page_blocks():
        assert f'--8<-- "docs/snippets/{kind}.py"' in text, kind


@pytest.fixture
def flash_attn_stand_in(monkeypatch):
    module = stand_in_flash_attn()
    if module is not None:
        monkeypatch.setitem(sys.modules, "flash_attn", module)
    for name, stand_in in stand_in_xformers().items():
        monkeypatch.setitem(sys.modules, name, stand_in)


@pytest.mark.parametrize("kind", sorted(page_blocks()))
def test_message_block_is_the_real_output(kind, monkeypatch, flash_attn_stand_in):
    monkeypatch.chdir(ROOT)  # locations in messages are relative to the working directory
    if kind in NEEDS_FLASH_KERNELS and not _has_flash_kernels():
        actual, kinds = _kernel_message(kind)
    else:
        actual, kinds = capture(run_script(f"docs/snippets/{kind}.py"))
    assert kind in kinds, f"docs/snippets/{kind}.py produced {kinds}, not {kind}"
    if regen_enabled() and page_blocks()[kind] != actual:
        text = PAGE.read_text()
        text = _BLOCK.sub(
            lambda m: m.group(1) + actual + "\n```" if m.group(2) == kind else m.group(0), text
        )
        PAGE.write_text(text)
    assert page_blocks()[kind] == actual, "run with SHAPEGUARD_REGEN=1 and review the diff"


def _has_flash_kernels() -> bool:
    try:
        import flash_attn  # noqa: F401
        import torch
    except ImportError:
        return False
    return hasattr(torch.ops.flash_attn, "_flash_attn_forward") and torch.cuda.is_available()


def _kernel_message(kind: str) -> tuple[str, list[str]]:
    """Without flash-attn's kernel ops, the message its check gives for the snippet's call:
    the same checker and the same rendering, the snippet's call line as the location."""
    import torch

    from shapeguard import ShapeError
    from shapeguard._errors import Context
    from shapeguard._trace import flash as _flash

    path = f"docs/snippets/{kind}.py"
    lines = (ROOT / path).read_text().splitlines()
    number, source = next(
        (i, line.strip())
        for i, line in enumerate(lines, 1)
        if "torch.ops.flash_attn._flash_attn_forward(" in line
    )
    op = "torch.ops.flash_attn._flash_attn_forward"
    q = torch.empty(2, 5, 3, 12, dtype=torch.float16, device="meta")
    k = torch.empty(2, 7, 3, 12, dtype=torch.float16, device="meta")
    specs = [_flash.spec(n, t) for n, t in (("q", q), ("k", k), ("v", k))]
    violation = next(_flash.check_dense(*specs, op=op, flash=True, kernel=True))
    violation.op = op
    error = ShapeError.from_violation(
        violation, Context(location=f"{path}:{number}", source=source)
    )
    return f"shapeguard.ShapeError: {error}", [error.kind]
