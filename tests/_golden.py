"""Golden files: output compared byte for byte with a file under tests/golden/.

`SHAPEGUARD_REGEN=1 python -m pytest tests/test_golden.py tests/test_pytest_plugin.py`
rewrites them from what runs now; review the diff before committing it.
"""

import pathlib

from _docs_support import regen_enabled

GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if regen_enabled():
        path.write_text(text)
        return
    if not path.exists():
        raise AssertionError(f"no golden file {path}: run with SHAPEGUARD_REGEN=1 to write it")
    expected = path.read_text()
    if text != expected:
        # pytest's diff of the two texts names the first differing line.
        assert text.splitlines() == expected.splitlines(), f"{name} differs from its golden file"
        assert text == expected, f"{name} differs from its golden file in line endings"
