"""The one way to run code under a session: `recording_session()` for a block, `begin()` where the
start and the end are in different hooks (the guard's pre- and post-forward hooks).

Every opener (`shapeguard.trace`, a guarded module, the CLI's run, `check` and its
probes) goes through here, so a session is always entered the same way (the root module
entered with the forward's inputs, which names them and checks its head counts before
its first op) and always closed, also when the forward raises.
"""

from .. import _config
from .record import TraceData
from .session import Session, close_session, open_session


def begin(
    trace: TraceData, model=None, args: tuple = (), kwargs: dict | None = None, opener=None
) -> Session:
    """Open a session that records into `trace`. With a module, enter it with the inputs
    of its forward. The caller closes the session with `close_session`, also on error;
    if entering the module raises, the session is closed before the error leaves.
    `opener`: the record of the sessions this one repeats (`_replay.opener`), if any."""
    root = model if hasattr(model, "named_modules") else None
    session = open_session(trace, root=root, opener=opener)
    if root is not None:
        try:
            session.enter_module(root, args, {} if kwargs is None else kwargs)
        except BaseException:
            close_session(session)
            raise
    return session


class recording_session:  # noqa: N801 (used as a function: `with recording_session(...) as session`)
    """A session open for the block (see `begin`), closed when it ends however it ends.

    A class, not a generator: errors raised while entering are located at the user's line,
    and a generator's frame would sit in contextlib, between shapeguard and the user.
    """

    __slots__ = ("_opened", "_session")

    def __init__(
        self,
        trace: TraceData,
        model=None,
        args: tuple = (),
        kwargs: dict | None = None,
        opener=None,
    ):
        self._opened = (trace, model, args, kwargs, opener)
        self._session: Session | None = None

    def __enter__(self) -> Session:
        self._session = begin(*self._opened)
        return self._session

    def __exit__(self, *exc_info) -> None:
        session, self._session = self._session, None
        if session is not None:
            close_session(session)


def run_observed(model, args: tuple, kwargs: dict, observer_for):
    """`model(*args, **kwargs)` once, in a session of its own with checks off, told to the
    observer `observer_for(session)` makes (`Session.observe`); returns what the model
    returned. For readers of one forward (attention weights, dtypes) that check nothing:
    they see the ops through the one interceptor, with the session's module paths."""
    with (
        _config.disabled(),
        recording_session(TraceData(mode="warn"), model, args, kwargs) as session,
        session.observe(observer_for(session)),
    ):
        return model(*args, **kwargs)
