"""A replay states why it steps aside, and `SHAPEGUARD_REPLAY=check` proves what it replays.

Each session counts on its trace the reasons its replay stopped (`trace.replay_stops`, the
keys of `_replay.Why`): "why did this model stop replaying?" has an answer. Under
`SHAPEGUARD_REPLAY=check`, every step a replay matches runs on the reference path instead,
and the step that path records must be the recorded one, field by field.
"""

import pytest
import torch
from test_replay import (
    Attention,
    _fresh_recordings,  # noqa: F401  (autouse: no recordings kept between tests)
    _reference,
    _same,
    _steps,
    _trace,
)

import shapeguard
from shapeguard._trace import replay as _replay
from shapeguard._trace import replay_match as _replay_match
from shapeguard._trace.replay import Why

pytestmark = pytest.mark.no_shapeguard  # the plugin's own session would hold every op


@pytest.fixture
def plain(monkeypatch):
    monkeypatch.setenv("SHAPEGUARD_REPLAY", "1")


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setenv("SHAPEGUARD_REPLAY", "check")


def test_a_replay_that_follows_through_states_no_reason(plain):
    third = _steps(Attention(), torch.randn(2, 5, 12))[2]
    assert third._replayed == third._steps
    assert third.replay_stops == {}


def test_other_shapes_stop_at_the_start(plain):
    model = Attention()
    _steps(model, torch.randn(2, 5, 12))
    other = _trace(model, (torch.randn(2, 6, 12),))
    assert other.replay_stops == {Why.OTHER_START: 1}


def test_a_replay_that_reaches_a_finding_gives_the_recording_s_reason(plain):
    class Carve(Attention):
        def forward(self, x):
            B, T, C = x.shape
            q = self.qkv(x)[..., :C].reshape(B, self.n_heads, T, C // self.n_heads)  # carve
            return q.sum()

    traces = _steps(Carve(12, 3), torch.randn(3, 3, 12))
    assert traces[1].replay_stops == {}  # (recorded, not replayed)
    assert traces[2].replay_stops == {"recorded: " + Why.FINDING: 1}


def test_another_line_is_the_reason(plain):
    x = torch.randn(2, 3)

    def run(other: bool):
        with shapeguard.trace() as t:
            y = x.relu()
            y = y.sigmoid() if other else y.tanh()
        return t

    run(False), run(False)
    assert run(True).replay_stops == {Why.OTHER_FUNCTION: 1}


def test_a_number_of_another_type_is_not_replayed(plain, monkeypatch):
    # A number no rule reads is compared by its type: a complex scalar makes a complex
    # tensor, which a replay of the float one would record as float32.
    x = torch.randn(2, 3)

    def run(scale):
        with shapeguard.trace() as t:
            x - scale
        return t

    run(0.5), run(0.25)
    assert run(0.125)._replayed > 0
    other = run(0.5j)
    assert [e.outputs[0].dtype for e in other.events] == ["complex64"]
    assert other.replay_stops == {Why.OTHER_ARGUMENTS: 1}


def test_checked_replays_are_the_reference_path_s(checked, monkeypatch):
    model = Attention()
    x = torch.randn(2, 5, 12)
    mask = torch.ones(2, 5, dtype=torch.long)
    reference = _reference(monkeypatch, model, (x, mask))
    first, _, third = _steps(model, x, mask)
    assert third._replayed == third._steps > 0
    _same(third, reference)
    _same(first, reference)


def test_a_check_names_the_op_and_the_fields_that_differ(checked):
    model = Attention()
    x = torch.randn(2, 5, 12)
    _steps(model, x)  # (the third replays, checked)
    for recording in _replay.opener("model", model).recordings:
        for step in recording.steps:
            if step.kind == _replay.OP and step.event[0] == "softmax":
                effects = step.effects
                effects.templates = tuple(
                    (t, facts._replace(label="wrong")) for t, facts in effects.templates
                )
    with pytest.raises(_replay.ReplayMismatch) as raised:
        _trace(model, (x,))
    message = str(raised.value)
    assert "the replay of softmax differs from the reference path: output facts:" in message
    assert "label='wrong'" in message and "label='attn'" in message


def test_the_matcher_answers_what_the_plain_comparison_answers(plain, monkeypatch):
    # `_replay_match.matcher` compiles the comparison of a step's arguments and inputs; on every
    # call a replay compares, against every recorded step of the same function (the one it
    # is, and the ones it is not), it answers what `_replay_match.compare` answers.
    answers: list = []
    recorded: list = []
    make = _replay_match.matcher

    def matcher(step):
        match = make(step)
        if match is False:
            return match

        def checked(args, kwargs, get):
            for other in recorded:
                if other.kind != _replay.OP or other.func is not step.func:
                    continue
                compiled = make(other)
                if compiled is not False:
                    expected = _replay_match.compare(other, args, kwargs, get)
                    assert compiled(args, kwargs, get) == expected, other.event[0]
                    answers.append(expected is None)
            return match(args, kwargs, get)

        return checked

    monkeypatch.setattr(_replay_match, "matcher", matcher)
    model = Attention()
    x = torch.randn(2, 5, 12)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 4] = 0
    _trace(model, (x, mask)), _trace(model, (x, mask))
    recorded += _replay.opener("model", model).recordings[0].steps
    third = _trace(model, (x, mask))
    assert third._replayed == third._steps > 0
    assert answers.count(False) > 10 and answers.count(True) > 10  # the step, and not
