"""The sessions open in this context: read by everything that runs inside one (the
interceptor, composites, flash-attn's wrappers, contracts) without importing the session.

A trace belongs to the code that opened it, not to its thread: two asyncio tasks that each
open `with shapeguard.trace():` and await inside record each into its own trace, as
`decimal`'s contexts and OpenTelemetry's spans do. So the open sessions are a ContextVar
(a thread starts with an empty context; a task copies its creator's), holding an immutable
tuple, outermost first, that a session replaces when it opens and when it closes.
"""

import contextvars
import threading

open_sessions: contextvars.ContextVar[tuple] = contextvars.ContextVar(
    "shapeguard_open_sessions", default=()
)

# `eager`: set while a compiled module is checked eagerly (`_compiled.check`); dynamo
# traces in the calling thread, so this one stays per thread.
thread_state = threading.local()


def current_session():
    """The innermost session open in this context (a `_trace.session.Session`), or None.

    A task created inside a block and still running after the block closed holds the
    closed session in its copy of the context: it is outside any trace then."""
    found = open_sessions.get()
    if found:
        session = found[-1]
        if session.live:
            return session
    return None


def opened(session) -> contextvars.Token:
    """Make `session` the innermost open one of this context; returns the token `closed` takes."""
    return open_sessions.set((*open_sessions.get(), session))


def closed(session, token: contextvars.Token | None) -> None:
    """Take `session` out of this context's open sessions, wherever it sits: blocks closed
    first-opened-first (two generators, a framework's `__exit__` calls) leave the others
    open. Reset by `token` when that restores exactly the sessions still open."""
    found = open_sessions.get()
    if session not in found:
        return  # closed from another context: that one's copy shows it closed (`live`)
    rest = tuple(s for s in found if s is not session)
    if token is not None and found[-1] is session:
        before = token.old_value
        if (before is contextvars.Token.MISSING and not rest) or before == rest:
            try:
                open_sessions.reset(token)
                return
            except (ValueError, RuntimeError):  # made in another context, or used
                pass
    open_sessions.set(rest)
