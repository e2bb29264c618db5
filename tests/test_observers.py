"""`Session.observe`: what the probes' Watch and any other observer of a trace are told.

An observer hears of every op the session's interceptor is handed, once, before and after
it runs (with its output); it is gone when its block ends, also on an error; a session
with none pays one attribute test; an observed session neither replays nor suspends a
composite, so the observer sees every op.
"""

import contextlib

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard._probes.watch import Watch
from shapeguard._public_trace import Trace
from shapeguard._trace import replay as _replay
from shapeguard._trace import session as _session
from shapeguard._trace.current import current_session
from shapeguard._trace.opening import recording_session

pytestmark = pytest.mark.no_shapeguard  # the plugin's own session would hold every op


class Recorder:
    """An observer noting each op before it runs, and after: its output and the event the
    session recorded for it."""

    def __init__(self, session) -> None:
        self.session = session
        self.calls: list[str] = []
        self.seen: list[tuple] = []

    def before(self, func, op, args, kwargs) -> None:
        self.calls.append(op)

    def after(self, func, op, args, kwargs, out, count) -> None:
        events = self.session.trace.events
        recorded = events[count].op if len(events) > count else None
        self.seen.append((op, out, recorded))


class Ops:
    """Three ops the trace records, by name."""

    def __init__(self) -> None:
        self.outputs: list = []

    def __call__(self, x):
        y = x.relu()
        z = torch.matmul(y, y.transpose(0, 1))
        self.outputs += [y, z]
        return z


def test_an_observer_sees_each_op_once_with_its_output():
    x = torch.randn(4, 3)
    ops = Ops()
    with recording_session(Trace()) as session:
        observer = Recorder(session)
        with session.observe(observer):
            ops(x)
    assert observer.calls == ["relu", "transpose", "matmul"]
    assert [op for op, _, _ in observer.seen] == observer.calls
    y, z = ops.outputs
    assert observer.seen[0][1] is y and observer.seen[2][1] is z
    # `count` is the event count before the op: the op's own event follows it.
    assert [recorded for _, _, recorded in observer.seen] == observer.calls
    assert [e.op for e in session.trace.events] == observer.calls  # its own calls unrecorded


def test_an_observer_is_removed_after_an_exception():
    x = torch.randn(4, 3)
    with recording_session(Trace()) as session:
        observer = Recorder(session)
        with pytest.raises(ValueError), session.observe(observer):
            x.relu()
            raise ValueError("the forward fails")
        assert session.observers == ()
        x.relu()
        watch = Watch(session)
        with pytest.raises(ValueError), watch:
            raise ValueError("a probe's forward fails")
        assert session.observers == ()
    assert observer.calls == ["relu"]


def test_a_closed_observation_ends_that_registration_only():
    with recording_session(Trace()) as session:
        observer = Recorder(session)
        first, second = session.observe(observer), session.observe(observer)
        first.close()
        first.close()  # closing twice removes nothing more
        assert session.observers == (observer,)
        second.close()
        assert session.observers == ()


def test_without_an_observer_the_interceptor_never_calls_into_observers(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("an unobserved session took the observers' path")

    monkeypatch.setattr(_session.Session, "_observed", fail)
    x = torch.randn(4, 3)
    with recording_session(Trace()) as session:
        assert session.observers == ()
        Ops()(x)
    assert [e.op for e in session.trace.events] == ["relu", "transpose", "matmul"]


def test_an_observed_session_does_not_replay():
    _replay.forget_all()
    model = nn.Sequential(nn.Linear(12, 12), nn.ReLU())
    x = torch.randn(2, 5, 12)

    def run(observe: bool):
        with torch.no_grad(), shapeguard.trace() as t:
            session = current_session()
            observer = Recorder(session)
            with session.observe(observer) if observe else contextlib.nullcontext():
                model(x)
        return t, observer

    try:
        plain = [run(False)[0] for _ in range(3)]
        assert plain[2]._replayed > 0  # this line replays from its third session on
        for _ in range(2):
            observed, observer = run(True)
            assert observed._replayed == 0
            assert observer.calls == ["linear", "relu"]
            assert observed.to_dict() == plain[0].to_dict()
    finally:
        _replay.forget_all()


def test_an_observed_composite_runs_its_ops_in_view():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)

    class User(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x) * 2

    model = User()
    with torch.no_grad(), recording_session(Trace(), model, (x,)) as session:
        watch = Watch(session, keep_values=True)
        with watch:
            model(x)
    ops = [op for op, *_ in watch.values or []]
    assert "multi_head_attention_forward" in ops and "layer_norm" in ops
    assert [e.op for e in session.trace.events] == ops  # the session checked them one by one
    with torch.no_grad(), recording_session(Trace(), model, (x,)) as session:
        model(x)  # unobserved: suspended for torch's fast path, one event for the layer
    assert [e.op for e in session.trace.events] == ["TransformerEncoderLayer", "mul"]


def test_a_composite_root_entered_before_the_observer_is_seen_op_by_op():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), recording_session(Trace(), layer, (x,)) as session:
        watch = Watch(session, keep_values=True)
        with watch:
            layer(x)
    ops = [op for op, *_ in watch.values or []]
    assert "multi_head_attention_forward" in ops and "layer_norm" in ops
    # The session still checks the layer at its boundary and records it as one call.
    assert [e.op for e in session.trace.events] == ["TransformerEncoderLayer"]
    assert torch._C._len_torch_function_stack() == 0


def test_a_watch_pushes_no_mode_of_its_own():
    with recording_session(Trace()) as session:
        with Watch(session):
            depth = torch._C._len_torch_function_stack()
            top = torch._C._get_function_stack_at(depth - 1)
        assert depth == 1 and top is session._mode


# -- run_observed: one forward read, nothing checked --------------------------------------
def test_run_observed_tells_every_op_and_checks_nothing():
    from shapeguard._trace.opening import run_observed

    class Broken(nn.Module):  # a regroup that cannot hold: a checked forward would raise
        def forward(self, x):
            return x.softmax(-1).view(3, -1, 5)

    made: list = []
    out = run_observed(
        Broken(), (torch.randn(2, 15),), {}, lambda s: made.append(Recorder(s)) or made[-1]
    )
    (recorder,) = made
    assert out.shape == (3, 2, 5) and recorder.calls == ["softmax", "view"]
    assert not recorder.session.trace.findings and current_session() is None


def test_the_interceptor_is_the_only_mode_over_a_models_ops():
    """Readers of a forward observe the session (the probes' Watch, `capture_attention`,
    check's dtype scan, the CLI's input discovery); the one other mode, `ValueReads`, is pushed inside the interceptor
    around the rules' own torch calls and never sees a model's op."""
    import pathlib
    import re

    package = pathlib.Path(shapeguard.__file__).parent
    modes = {
        f"{path.relative_to(package)}:{name}"
        for path in package.rglob("*.py")
        for name in re.findall(
            r"^\s*class (\w+)\((?:\w+\.)*TorchFunctionMode\)", path.read_text(), re.M
        )
    }
    assert modes == {"_trace/interceptor.py:Interceptor", "_trace/replay_match.py:ValueReads"}
