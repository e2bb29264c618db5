"""The bounded memo tables (`shapeguard/_memo.py`): each keeps at most its bound, makes
room its one stated way, and is registered so `clear_all` reaches it."""

import ast
import importlib
import pathlib
import pkgutil
import threading

import pytest
from package_source import parsed

import shapeguard
from shapeguard import _memo
from shapeguard._memo import Memo


def test_drop_all_empties_the_table_when_full_and_counts_the_clear():
    clears = []
    memo = Memo("test: drop all", 3, on_clear=lambda: clears.append(len(memo)))
    for key in "abc":
        memo.put(key, key.upper())
    assert (len(memo), clears) == (3, [])
    memo.put("a", "again")  # a key already there makes no room
    assert (memo.get("a"), len(memo), clears) == ("again", 3, [])
    assert memo.put("d", "D") == "D"
    assert [memo.get(k) for k in "abcd"] == [None, None, None, "D"]
    assert clears == [0]  # run once, after the table was emptied


def test_a_kept_get_stays_valid_across_clears():
    memo = Memo("test: kept get", 2)
    get = memo.get  # what a hot path keeps in a local or a module name
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("c", 3)  # made room: emptied
    memo.clear()
    memo.put("d", 4)
    assert (get("a"), get("d"), get("e", "absent")) == (None, 4, "absent")


def test_drop_oldest_drops_the_first_put_and_pop_then_put_makes_an_entry_newest():
    memo = Memo("test: drop oldest", 3, drop="oldest")
    for key in "abc":
        memo.put(key, key)
    memo.put("a", memo.pop("a"))  # used: now the newest
    memo.put("d", "d")
    assert list(memo) == ["c", "a", "d"]
    memo.put("e", "e")
    assert list(memo) == ["a", "d", "e"]
    assert len(memo) == memo.bound


def test_held_entries_answer_only_for_the_object_they_hold():
    memo = Memo("test: held", 4)
    owner, other = object(), object()
    assert memo.hold(id(owner), owner, "value") == "value"
    assert memo.held(id(owner), owner) == "value"
    assert memo.held(id(owner), other) is None  # an id reused by another object
    assert memo.get(id(owner)) == (owner, "value")  # the entry keeps its owner alive


def test_threads_making_room_at_once_keep_the_bound_and_raise_nothing():
    memo = Memo("test: threads", 16, drop="oldest")
    errors = []

    def fill(base: int) -> None:
        try:
            for i in range(2000):
                memo.put((base, i), i)
                memo.put((base, i), memo.pop((base, i)))  # used again: the newest
        except Exception as error:  # any error is the failure this test reports
            errors.append(repr(error))

    threads = [threading.Thread(target=fill, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(memo) == memo.bound


def test_clear_all_empties_every_memo_and_runs_their_on_clear():
    cleared = []
    first = Memo("test: first", 4, on_clear=lambda: cleared.append("first"))
    second = Memo("test: second", 4, drop="oldest")
    first.put(1, 1)
    second.put(2, 2)
    assert first in _memo.memos() and second in _memo.memos()
    _memo.clear_all()
    assert (len(first), len(second), cleared) == (0, 0, ["first"])


def test_a_memo_without_a_bound_or_with_another_policy_is_refused():
    with pytest.raises(ValueError, match="memo 'x': bound 0 must be at least 1"):
        Memo("x", 0)
    with pytest.raises(
        ValueError, match=r"memo 'y': drop 'newest' is not one of \('all', 'oldest'\)"
    ):
        Memo("y", 8, drop="newest")


def _import_every_module() -> None:
    for info in pkgutil.walk_packages(shapeguard.__path__, "shapeguard."):
        if "flash_attn" in info.name:
            continue
        importlib.import_module(info.name)


def test_every_cache_of_the_package_is_a_registered_bounded_memo():
    _import_every_module()
    package = [m for m in _memo.memos() if not m.name.startswith("test:")]
    names = {m.name for m in package}
    # The caches moved to Memo (issue 27): each one is found, with a bound and a policy.
    assert {
        "code kinds", "parsed blocks", "file stamps", "sites", "renamed sites", "view plans",
        "function assignments", "keys-first products", "tensor methods", "dtype names",
        "dtype names (trace)", "dtype facts", "shared tuples", "op specs", "replay matchers",
        "replay openers", "flash parameters", "fresh origins", "einsum verdicts",
        "contract specs",
    } <= names  # fmt: skip
    for memo in package:
        assert 1 <= memo.bound <= 50_000, memo
        assert memo.drop in ("all", "oldest"), memo
        assert len(memo) <= memo.bound, memo


def test_a_traced_forward_keeps_every_memo_within_its_bound():
    torch = pytest.importorskip("torch")
    model = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)
    sites = next(m for m in _memo.memos() if m.name == "sites")
    with shapeguard.trace() as trace:
        model(x, x, x)
    assert trace.events and len(sites) > 0
    assert all(len(m) <= m.bound for m in _memo.memos())


# Module-level dicts of the package that are not caches, each with why: any other one is
# a cache, and belongs in a Memo (a stale entry fails too, so the list only shrinks).
NOT_CACHES = {
    ("shapeguard._ops", "_TABLE"): "the op table, built at import",
    ("shapeguard._ops", "_OTHERS"): "one Op per spelling, compared by identity",
    ("shapeguard._compiled", "_compiled_errors"): "one class per error type, for except",
    ("shapeguard.checks", "_DECLARED"): "the kinds each rule family declares",
    ("shapeguard.checks._flash_contract", "WRAPPED"): "the entry points the open trace wraps",
    ("shapeguard._names.flow.base", "_RULES"): "the axis rules, registered at import",
    ("shapeguard._names.flow.waiting", "_HANDED"): "findings handed from a call's rules",
    ("shapeguard._names.flow.waiting", "_WAITING"): "findings waiting on a live tensor",
    ("shapeguard._trace.replay", "_BARRIERS"): "one barrier step per Why reason",
    ("shapeguard._trace.composites", "_watched"): "the modules a guard watches",
}


def _module_dicts() -> set[tuple[str, str]]:
    root = pathlib.Path(shapeguard.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in parsed(path).body:
            target = node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
            value = getattr(node, "value", None)
            empty = isinstance(value, ast.Dict) and not value.keys
            if isinstance(target, ast.Name) and empty:
                found.add((module, target.id))
    return found


def test_every_module_level_dict_of_the_package_is_a_memo_or_says_why_not():
    found = _module_dicts()
    assert sorted(found - NOT_CACHES.keys()) == [], "a cache: make it a _memo.Memo"
    assert sorted(NOT_CACHES.keys() - found) == [], "stale: remove from NOT_CACHES"
