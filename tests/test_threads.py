"""The threading contract: a trace belongs to the context that opened it, and a thread
starts with its own (asyncio tasks: tests/test_lifecycle.py). Several threads
tracing at once each get their own events and findings, nothing leaks from one to another,
and `shapeguard.disabled()` switches off only the thread that entered it."""

import threading
import warnings

import pytest
import torch
from torch import nn

import shapeguard

pytestmark = pytest.mark.no_shapeguard


class Attention(nn.Module):
    """softmax over the queries when `bug`: queries that are no keys, so one
    aggregation_axis warning at `attn @ v` (nothing renormalised the weights over the keys
    in between), nothing else."""

    def __init__(self, bug: bool):
        super().__init__()
        self.bug = bug

    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1)
        attn = scores.softmax(dim=-2 if self.bug else -1)
        return attn @ v


def _inputs(seq_q: int):
    return torch.randn(2, 3, seq_q, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8)


def _run_threads(work, count: int) -> list:
    results: list = [None] * count
    errors: list = []
    barrier = threading.Barrier(count)

    def body(i):
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a tracing thread hung"
    assert not errors, errors
    return results


def test_threads_tracing_at_once_keep_their_own_findings():
    def work(i):
        bug = i % 2 == 1
        seq_q = 4 + i  # each thread its own shapes
        rounds = []
        for _ in range(5):
            with shapeguard.trace(mode="warn") as t:
                Attention(bug)(*_inputs(seq_q))
            rounds.append(t)
        return bug, seq_q, rounds

    # The warnings filters are the process's, not a thread's: set once, around all threads.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", shapeguard.ShapeWarning)
        results = _run_threads(work, 6)
    for bug, seq_q, rounds in results:
        for t in rounds:
            assert [f.kind for f in t.findings] == (["aggregation_axis"] if bug else [])
            scores = t.shape_of("scores")
            assert scores == (2, 3, seq_q, 7), "another thread's events leaked in"
            assert len(t.events) == len(rounds[0].events)


def test_a_guard_shared_by_threads_checks_each_call_in_its_own_thread():
    model = shapeguard.guard(Attention(bug=False))

    def work(i):
        out = model(*_inputs(4 + i))
        return tuple(out.shape), shapeguard.last_trace(model) is not None

    for i, (shape, traced) in enumerate(_run_threads(work, 4)):
        assert shape == (2, 3, 4 + i, 8)
        assert traced


def test_disabled_switches_off_only_its_own_thread():
    inside = threading.Event()
    release = threading.Event()
    seen = {}

    def disabled_thread():
        with shapeguard.disabled():
            seen["disabled"] = shapeguard.is_enabled()
            inside.set()
            release.wait(timeout=30)
        seen["after"] = shapeguard.is_enabled()

    t = threading.Thread(target=disabled_thread)
    t.start()
    inside.wait(timeout=30)
    try:
        assert shapeguard.is_enabled(), "a disabled() block in another thread switched this one off"
        with pytest.raises(shapeguard.ShapeError):
            shapeguard.trace(Attention(bug=False), *_inputs(4)[:2], torch.randn(2, 3, 6, 8))
    finally:
        release.set()
        t.join(timeout=30)
    assert seen == {"disabled": False, "after": True}


def test_disabled_lets_everything_through_and_comes_back_after_an_exception():
    bad = (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 6, 8))
    with shapeguard.disabled():
        with shapeguard.disabled():  # blocks nest
            assert not shapeguard.is_enabled()
        assert not shapeguard.is_enabled()
        with shapeguard.trace() as t:
            Attention(bug=True)(*_inputs(4))
        assert t.findings == [] and len(t.events) == 0
    assert shapeguard.is_enabled()
    with pytest.raises(ZeroDivisionError), shapeguard.disabled():
        raise ZeroDivisionError("inside the block")
    assert shapeguard.is_enabled()
    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(Attention(bug=False), *bad)
    assert info.value.kind in ("sdpa_kv_seq", "matmul_inner", "matmul_batch")


def test_locations_follow_the_working_directory(tmp_path, monkeypatch):
    """A location is shown relative to the working directory of the moment it is shown:
    after os.chdir the same file reads from the new place (no stale cache)."""
    from shapeguard._source import display_path

    inner = tmp_path / "pkg"
    inner.mkdir()
    target = str(inner / "model.py")
    monkeypatch.chdir(tmp_path)
    assert display_path(target) == "pkg/model.py"
    monkeypatch.chdir(inner)
    assert display_path(target) == "model.py"
    monkeypatch.chdir(tmp_path)
    assert display_path(target) == "pkg/model.py"


def test_every_parse_in_the_package_takes_turns():
    """CPython 3.11's AST constructor shares its recursion depth between threads (gh-106905):
    two threads parsing at once can raise SystemError. shapeguard's parses go through
    `_source.parse`, which takes a lock; a bare `ast.parse` elsewhere would bring it back."""
    import pathlib
    import re

    package = pathlib.Path(__file__).resolve().parent.parent / "shapeguard"
    bare = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bast\.parse\(", line) and path.name != "_source.py"
    ]
    assert not bare, f"parse with shapeguard._source.parse instead: {bare}"
