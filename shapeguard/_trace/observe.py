"""Observers of a session (`Session.observe`): told of every op its interceptor is handed.

The probes' Watch and `capture_attention` are the two. An observer needs no mode of its
own, so a session's mode stays the only shapeguard mode on torch's stack.
"""

from typing import Protocol

from . import composites as _composites


class Observer(Protocol):
    """What `Session.observe` tells: `count` is the trace's event count before the op (the
    op's own event, when it was recorded, is the one after it)."""

    def before(self, func, op: str, args: tuple, kwargs: dict) -> None: ...

    def after(self, func, op: str, args: tuple, kwargs: dict, out, count: int) -> None: ...


class Observation:
    """An observer's registration; `close()` (or leaving its `with` block) ends it."""

    __slots__ = ("observer", "session")

    def __init__(self, session, observer: Observer) -> None:
        # The session untyped: this module sits below session.py, which imports it.
        self.session = session
        self.observer = observer

    def close(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return  # closed already
        found = list(session.observers)
        for i, observer in enumerate(found):
            if observer is self.observer:  # this registration only, if it was made twice
                del found[i]
                break
        session.observers = tuple(found)
        _composites.observed(session)  # a composite suspended again once none is left

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
