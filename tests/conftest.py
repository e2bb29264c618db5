"""Shared test setup: pytester runs real pytest sessions (the plugin's tests use it)."""

import os

import pytest
import torch

pytest_plugins = ["pytester"]

# shapeguard's own failures (a rule's or the recording's bug) fail loudly here: users' runs
# contain them (`shapeguard/_trace/internal.py`), so the suite could otherwise go green on
# a swallowed bug. Set before any test, and inherited by the CLI subprocesses.
os.environ["SHAPEGUARD_INTERNAL_ERRORS"] = "raise"

# One torch thread for the whole suite, as CI runs it (two cores, used by pytest-xdist's two
# workers when asked): the ops are tiny, and with a second thread its OpenMP worker spins
# through every gap between ops, which bills the process for twice the Python time.
torch.set_num_threads(1)
# The CLI, torchrun and spawned-rank subprocesses too: a second OpenMP thread per process
# only spins while the other worker's process wants the core.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Files whose tests start processes or build real models, run first: pytest-xdist hands tests
# out in collection order, so a long test collected last keeps one worker busy while the other
# has nothing left (the tail). Only the order changes; each test is independent of it.
LONG_FIRST = (
    "test_distributed.py",
    "test_world_sample.py",
    "test_cli_users.py",
    "test_meta_imports.py",
    "test_pytest_plugin.py",
    "test_packaging.py",
    "test_bench_smoke.py",
    "test_real_models.py",
    "test_check_real_models.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable


@pytest.fixture(autouse=True)
def _no_terminal_size(monkeypatch):
    """Piped CLI output is as wide as COLUMNS says; pytest-xdist's workers set it to 80.
    Tests see none unless they set it, so their output does not depend on the runner."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
