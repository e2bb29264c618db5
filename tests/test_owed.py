"""A replayed step's effects are made when first read (`shapeguard/_trace/owed.py`).

A replaying session gives each output a pending meta (its slot only) and keeps the step in
its ledger; the first read of a pending meta makes every owed step, in order. These tests
prove both halves: a guarded forward nobody reads makes no axes at all, and whenever the
metas are read (after the session, in the middle of it, past the ledger's bound, on a
replay that diverges) the trace equals the one replay off gives.
"""

import pytest
import torch
from test_replay import (
    Attention,
    _fresh_recordings,  # noqa: F401  (autouse: no recordings kept between tests)
    _reference,
    _same,
    _trace,
)

import shapeguard
from shapeguard._names import dims as D
from shapeguard._trace import owed as _owed
from shapeguard._trace import replay_effects as _replay_effects
from shapeguard._trace.current import current_session

pytestmark = pytest.mark.no_shapeguard  # the plugin's own session would hold every op


@pytest.fixture(autouse=True)
def _plain_replay(monkeypatch):
    # What is deferred is the plain replay's: a checked one (`SHAPEGUARD_REPLAY=check`)
    # runs every step it matches on the reference path, which makes the axes at once.
    monkeypatch.setenv("SHAPEGUARD_REPLAY", "1")


def _guarded_forwards(model, x, count):
    with torch.no_grad():
        for _ in range(count):
            model(x)


def test_an_unread_replayed_forward_makes_no_axes(monkeypatch):
    model = shapeguard.guard(Attention())
    x = torch.randn(2, 5, 12)
    _guarded_forwards(model, x, 3)  # run, recorded, replayed
    before = D.serial()  # every Dim made takes the next serial
    _guarded_forwards(model, x, 1)
    assert D.serial() == before
    trace = shapeguard.last_trace(model)
    assert trace._replayed == trace._steps > 0
    assert trace._ledgers  # the closed session's ledger, handed to its trace
    # Read now: paid, and the same trace as one recorded without replay.
    unguarded = Attention()
    unguarded.load_state_dict(model.state_dict())
    reference = _reference(monkeypatch, unguarded, (x,))
    assert [[o.axes for o in e.outputs] for e in trace.events] == [
        [o.axes for o in e.outputs] for e in reference.events
    ]
    assert D.serial() > before
    assert not trace._ledgers
    assert any("heads" in o.axes for e in trace.events for o in e.outputs)


class _ReadsMidway(torch.nn.Module):
    """Attention whose forward hook on `qkv` reads the projection's axes while the
    session replays: the ledger is paid there and the rest is made at once."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Attention()
        self.read: list = []
        self.inner.qkv.register_forward_hook(self._read)

    def _read(self, module, args, output) -> None:
        session = current_session()
        if session is not None:
            meta = session.metas.get(output)
            if meta is not None:
                self.read.append((session.ledger.paid, meta.axes, session.ledger.paid))

    def forward(self, x):
        return self.inner(x)


def test_a_read_in_the_middle_pays_and_the_rest_is_made_at_once(monkeypatch):
    model = _ReadsMidway()
    x = torch.randn(2, 5, 12)
    traces = [_trace(model, (x,)) for _ in range(3)]
    assert traces[2]._replayed > 0
    paid_before, axes, paid_after = model.read[-1]
    assert (paid_before, paid_after) == (False, True)  # the read paid the ledger
    assert axes == model.read[0][1]  # the names an unreplayed session gave it
    for t in traces:
        _same(t, _reference(monkeypatch, model, (x,)))
    assert not traces[2]._ledgers  # nothing owed when the session closed


@pytest.mark.parametrize("bound, paid", [(4, True), (_owed.MAX_OWED, False)])
def test_a_ledger_past_its_bound_is_paid_at_the_next_forward(bound, paid, monkeypatch):
    monkeypatch.setattr(_owed, "MAX_OWED", bound)
    model = Attention()
    x = torch.randn(2, 5, 12)

    def run():
        with torch.no_grad(), shapeguard.trace() as t:
            for _ in range(3):  # one session, three forwards of the root
                model(x)
            # Read before the block closes (closing a trace of several forwards pays it).
            session = current_session()
            state = (session.ledger.paid, len(session.ledger.steps))
        return t, state

    (first, _), _, (third, (was_paid, owed)) = run(), run(), run()
    assert third._replayed > 0
    # Past the bound: paid at the second forward's start, the rest made at once.
    assert was_paid is paid
    assert (owed == 0) is paid
    _same(third, first)


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()
        self.halve = False

    def forward(self, x):
        y = self.attention(x)
        if self.halve:  # another step after the attention's: the replay diverges here
            y = y * 0.5
        return y.softmax(-1)


def test_a_replay_that_diverges_pays_before_it_checks(monkeypatch):
    # The session pays what it replayed, then checks the rest as usual, on the state the
    # replay made.
    model = _Scaled()
    x = torch.randn(2, 5, 12)
    for _ in range(3):
        _trace(model, (x,))
    model.halve = True
    diverged = _trace(model, (x,))
    assert 0 < diverged._replayed < diverged._steps
    assert not diverged._ledgers
    _same(diverged, _reference(monkeypatch, model, (x,)))


def test_a_step_that_cannot_be_made_gives_unnamed_axes_not_an_error(monkeypatch):
    model = shapeguard.guard(Attention())
    x = torch.randn(2, 5, 12)
    _guarded_forwards(model, x, 4)
    trace = shapeguard.last_trace(model)

    def broken(*args):
        raise IndexError("not the axes the step was recorded on")

    monkeypatch.setattr(_replay_effects, "apply", broken)
    events = trace.events  # paid now, each step failing
    assert [o.shape for e in events for o in e.outputs]  # shapes are kept
    assert all(a is None for e in events for o in e.outputs for a in o.axes)
