"""`import shapeguard` is cheap: no torch, click or flash_attn (pytest loads plugins in every run)."""

import subprocess
import sys

import shapeguard

HEAVY = ("torch", "click", "flash_attn")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def test_import_shapeguard_imports_no_heavy_dependency():
    loaded = _modules_after("import shapeguard")
    assert "shapeguard" in loaded
    assert not loaded & set(HEAVY)


def test_the_import_check_can_fail():
    # The same probe sees torch once something asks for it, so the test above is not vacuous.
    loaded = _modules_after("import shapeguard\nimport torch")
    assert "torch" in loaded


def test_every_public_name_imports():
    assert shapeguard.__all__ == sorted(shapeguard.__all__)
    for name in shapeguard.__all__:
        assert getattr(shapeguard, name) is not None, name
    assert isinstance(shapeguard.__version__, str) and shapeguard.__version__


def test_errors_read_as_public_names():
    assert shapeguard.ShapeError.__module__ == "shapeguard"
    assert issubclass(shapeguard.ShapeError, RuntimeError)
    assert issubclass(shapeguard.ShapeWarning, UserWarning)
    # shapeguard's own failure, contained: not a ShapeWarning (strict mode fails on those).
    assert shapeguard.ShapeguardInternalWarning.__module__ == "shapeguard"
    assert issubclass(shapeguard.ShapeguardInternalWarning, RuntimeWarning)
    assert not issubclass(shapeguard.ShapeguardInternalWarning, shapeguard.ShapeWarning)
