"""What every part of a session shares: its state, typed once.

`Session` (`_trace/session.py`) is made of parts, one concern each: the module stack,
naming the tensors first seen, recording, reporting, and the replay layer. Each part is a
class `Session` inherits; `Session.__init__` sets the state below, which they read and
write. For the type checker a part also has the others' methods (`__getattr__`).
"""

from typing import TYPE_CHECKING, Any


class SessionState:
    """The state of a session, as its parts see it (set by `Session.__init__`)."""

    if TYPE_CHECKING:
        from .meta import TensorTable
        from .owed import Ledger
        from .record import TraceData
        from .tp_session import SessionTP

        trace: TraceData
        metas: TensorTable
        module_stack: list
        enabled: bool
        _root: Any  # a weak reference to the root module, or None
        _paths: dict[int, str] | None
        _state_names: dict[int, str] | None
        _seen_modules: set[int]
        _declared: dict[int, dict[str, tuple[str, int]]]
        root_inputs: Any  # `_reach.intent.RootInputs` of the forward running, or None
        _warned: set[tuple[str, str]]
        _dispatching: bool
        # The replay layer's (`_trace/replay_layer.py`).
        _opener: Any
        replay: list | None
        _choices: list
        recorder: list | None
        step: int
        replayed: int
        _verifying: bool
        _expected: Any  # the recorded step a verified replay matched, or None
        _fresh: int
        # (step, reach) read again by `_values_pass` from other values, for `_replay_op`.
        _reach_passed: tuple | None
        ledger: Ledger
        observers: tuple
        tp: SessionTP

        def __getattr__(self, name: str) -> Any: ...
