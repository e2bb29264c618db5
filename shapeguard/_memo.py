"""One bounded memo table for every cache the package keeps across calls.

Each `Memo` states its bound and how it makes room: `drop="all"` empties the table when it
is full (what a cache of the few hundred functions or sites a model has needs: it fills
once, and a process that makes new code objects without end, a notebook, starts over),
`drop="oldest"` drops the entry put first (a cache of a few large values, parsed trees:
re-putting an entry after `pop` makes it the newest, so the order is that of use).
Every memo is registered, so tests can see each one's bound and `clear_all` resets them.

`get` is the table's own `dict.get`: a lookup costs what a plain dict's does, about 10 ns
more through the memo's attribute, so a hot path keeps `memo.get` in a local or a module
name (it stays valid: the table is emptied in place, never replaced). Only `put`, on a
miss, pays for the bound, under the memo's lock (threads share the memos: two that make
room at once must not both drop the oldest entry).

>>> squares = Memo("squares (doctest)", 2, drop="oldest")
>>> squares.put(1, 1), squares.put(2, 4), squares.put(3, 9)
(1, 4, 9)
>>> squares.get(1), squares.get(3), len(squares)
(None, 9, 2)
"""

import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

DROPS = ("all", "oldest")


class Memo:
    """A dict with a bound: `get(key)` (None when absent), `put(key, value)` (returns the
    value), `pop`, `clear`. `on_clear` runs after each time the table is emptied (by
    `clear`, `clear_all`, or `drop="all"` making room): a cache whose keys others hold
    counts its clears there. For keys made of `id(obj)`, `held`/`hold` keep `obj` in the
    entry, so the id is not reused while the entry lives, and check it on the way out."""

    __slots__ = ("name", "bound", "drop", "on_clear", "_table", "_lock", "get")

    get: Callable[..., Any]

    def __init__(
        self,
        name: str,
        bound: int,
        *,
        drop: str = "all",
        on_clear: Callable[[], None] | None = None,
    ) -> None:
        if bound < 1:
            raise ValueError(f"memo {name!r}: bound {bound} must be at least 1")
        if drop not in DROPS:
            raise ValueError(f"memo {name!r}: drop {drop!r} is not one of {DROPS}")
        self.name = name
        self.bound = bound
        self.drop = drop
        self.on_clear = on_clear
        self._table: dict = {}
        self._lock = threading.Lock()
        self.get = self._table.get
        _ALL.append(self)

    def put(self, key: Hashable, value: Any) -> Any:
        table = self._table
        with self._lock:
            if len(table) >= self.bound and key not in table:
                if self.drop == "all":
                    self._empty()
                else:
                    del table[next(iter(table))]
            table[key] = value
        return value

    def pop(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            return self._table.pop(key, default)

    def held(self, key: Hashable, owner: object) -> Any:
        """The value `hold` put for `owner` at `key`, or None (another object's: an id reused)."""
        entry = self._table.get(key)
        return entry[1] if entry is not None and entry[0] is owner else None

    def hold(self, key: Hashable, owner: object, value: Any) -> Any:
        """Put `value` at `key`, an id of `owner`'s, keeping `owner` alive with it."""
        self.put(key, (owner, value))
        return value

    def clear(self) -> None:
        with self._lock:
            self._empty()

    def _empty(self) -> None:
        self._table.clear()
        if self.on_clear is not None:
            self.on_clear()

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __iter__(self) -> Iterator:
        return iter(list(self._table))

    def __repr__(self) -> str:
        return f"Memo({self.name!r}, {len(self._table)}/{self.bound}, drop={self.drop!r})"


_ALL: list[Memo] = []


def memos() -> tuple[Memo, ...]:
    """Every memo made so far (a module's are made when it is imported)."""
    return tuple(_ALL)


def clear_all() -> None:
    """Empty every memo (tests that need a cold start; a source file that changed)."""
    for memo in _ALL:
        memo.clear()
