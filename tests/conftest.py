"""Shared test setup: pytester runs real pytest sessions (the plugin's tests use it)."""

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch):
    """Piped CLI output is as wide as COLUMNS says; pytest-xdist's workers set it to 80.
    Tests see none unless they set it, so their output does not depend on the runner."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
