"""The session open in this thread, if any: read by everything that runs inside one
(composites, flash-attn's wrappers, contracts) without importing the interceptor."""

import threading

# `session`: the innermost open session of this thread; `eager`: set while a compiled
# module is checked eagerly (`_compiled.check`).
thread_state = threading.local()


def current_session():
    """The innermost session open in this thread (a `_trace.session.Session`), or None."""
    return getattr(thread_state, "session", None)
