"""A tensor meta's facts and a dim's state are named records, copied whole.

A replay makes its outputs' metas from the recorded ones, and restores the state of the
dims a step changed: a field added to `Facts` or `DimState` must come through either, not
be dropped by a copy that lists the fields it knows.
"""

from typing import NamedTuple

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard._names import dims as D
from shapeguard._trace import recording as _recording
from shapeguard._trace import replay as _replay
from shapeguard._trace import session as _session
from shapeguard._trace.meta import Facts, TensorMeta

pytestmark = pytest.mark.no_shapeguard  # the plugin's own session would hold every op


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.kept: list = []

    def forward(self, x):
        q, k, v = self.qkv(x).split(16, dim=-1)
        scores = q @ k.transpose(-2, -1)
        out = scores.softmax(-1) @ v
        self.kept = [q, k, v, scores, out]
        return out


# A record with one field more than `Facts` (the same ones first): what a meta would
# hold once someone adds a field.
_Wider = NamedTuple("_Wider", [*((f, object) for f in Facts._fields), ("extra", str)])  # type: ignore[misc]


def _wider(**facts) -> tuple:
    return _Wider(**facts, extra=f"made by {facts['op']}")


def test_a_new_fact_survives_a_replay(monkeypatch):
    _replay.forget_all()
    monkeypatch.setattr(_recording, "Facts", _wider)  # what the reference path makes
    seen: list = []
    close = _session.Session.close

    def closing(self) -> None:
        kept = self.root.kept if self.root is not None else []
        seen.append([self.metas.get(t).facts for t in kept])  # (a replay owes them: paid)
        close(self)

    monkeypatch.setattr(_session.Session, "close", closing)
    model = _Attention()
    x = torch.randn(2, 5, 16)
    traces = [shapeguard.trace(model, x) for _ in range(3)]
    _replay.forget_all()
    assert traces[0]._replayed == 0 and traces[2]._replayed > 0
    first, _, replayed = seen
    assert [type(f) for f in replayed] == [_Wider] * 5
    assert [f.extra for f in replayed] == [
        "made by split",
        "made by split",
        "made by split",
        "made by matmul",
        "made by matmul",
    ]
    assert replayed == first


def test_a_meta_s_fields_are_its_facts():
    meta = TensorMeta(D.fresh_axes((2, 3)), ("q", None), label="scores", op="matmul")
    assert meta.facts == Facts(tags=("q", None), label="scores", op="matmul")
    assert [getattr(meta, f) for f in Facts._fields] == list(meta.facts)
    meta.role = "scores"  # set by name: a new record, the others unchanged
    assert meta.facts == Facts(tags=("q", None), label="scores", role="scores", op="matmul")


def test_a_dim_state_is_every_fact_a_claim_changes():
    # What a Dim holds besides its state: its identity (size, parent, serial) and where a
    # cut or a concatenation took it from. A slot added to Dim is one or the other.
    made = {"size", "parent", "cut", "joined", "serial"}
    assert set(D.Dim.__slots__) - set(D.DimState._fields) == made


def test_a_dim_state_is_restored_whole():
    other = D.Dim(4)
    dim = D.Dim(8, name="d_model", rank=D.PARAM, kind=D.FEATURE, kind_rank=D.PARAM)
    dim.parts = {(4, 2): ("heads", D.DECLARED)}
    dim.q_side = True
    dim.alias = (other, 1, 4)
    dim.origin = "axis 2 of x"
    state = D.state_of(dim)
    assert state.parts == (((4, 2), ("heads", D.DECLARED)),)
    copy = D.Dim(8)
    D.restore(copy, state)
    assert D.state_of(copy) == state
    assert copy.parts == dim.parts and copy.parts is not dim.parts  # never shared
