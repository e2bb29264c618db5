"""A trace stays bounded however long it runs: `max_events` caps the events (the ops past
it are still checked), and a finding that later forwards make again is counted, not kept
again."""

import warnings

import pytest
import torch
from attention_models import HandAttention

import shapeguard
from shapeguard import ContractError, ShapeError, ShapeWarning

pytestmark = pytest.mark.no_shapeguard

B, S, D = 2, 5, 33


def test_trace_keeps_at_most_max_events_and_still_checks():
    model = HandAttention()
    x = torch.randn(B, S, D)
    full = shapeguard.trace(model, x)
    capped = shapeguard.trace(model, x, max_events=3)
    assert len(capped.events) == 3
    assert capped.dropped_events == len(full.events) - 3
    assert [e.op for e in capped.events] == [e.op for e in full.events[:3]]
    with pytest.raises(ShapeError) as info:  # past the cap, ops are still checked
        shapeguard.trace(HandAttention(bug="k_not_transposed"), x, max_events=1)
    assert info.value.kind == "matmul_inner"


def test_guard_passes_max_events_to_its_traces():
    model = shapeguard.guard(HandAttention(), max_events=2)
    model(torch.randn(B, S, D))
    trace = shapeguard.last_trace(model)
    assert len(trace.events) == 2 and trace.dropped_events > 0


@pytest.mark.parametrize("value", [-1, 2.5, True, "10"])
def test_max_events_must_be_a_count(value):
    with pytest.raises(ContractError, match="max_events="):
        shapeguard.trace(max_events=value)
    with pytest.raises(ContractError, match="max_events="):
        shapeguard.guard(HandAttention(), max_events=value)


def test_a_finding_every_forward_is_counted_not_kept_again():
    model = HandAttention(bug="softmax_axis")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with shapeguard.trace(mode="warn") as trace:
            for _ in range(50):
                model(torch.randn(B, S, D))
    assert [(f.kind, f.count) for f in trace.findings] == [("softmax_axis", 50)]
    assert trace.findings[0].to_dict()["count"] == 50


def test_the_same_finding_twice_in_one_forward_is_kept_twice():
    from test_silent_bugs import Heads

    model = Heads("carve")  # one helper carves Q, K and V: three findings, one line
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeWarning)
        with shapeguard.trace(mode="warn") as trace:
            for _ in range(4):
                model(torch.randn(B, S, D))
    assert [(f.kind, f.count) for f in trace.findings] == [("view_mixes_axes", 4)] * 3


def test_a_long_trace_reads_the_same_events_as_one_forward_each():
    # Once a trace of several forwards ends, its pending events keep shared name tuples,
    # not every forward's metas: what they read must not change.
    model = HandAttention()
    x = torch.randn(B, S, D)
    with shapeguard.trace() as one:
        model(x)
    with shapeguard.trace() as long:
        for _ in range(4):
            model(x)
    single = [e.to_dict() for e in one.events]
    events = [e.to_dict() for e in long.events]
    assert len(events) == 4 * len(single)
    for k, event in enumerate(events):
        expected = dict(single[k % len(single)], index=k)
        assert event == expected


def test_the_tensor_table_holds_no_tensor_and_forgets_a_collected_one():
    from shapeguard._trace.meta import TensorTable

    table = TensorTable()
    kept, dropped = torch.zeros(2), torch.zeros(3)
    table[kept], table[dropped] = "kept", "dropped"
    table[kept] = "kept again"  # a new entry for the same tensor replaces the old one
    assert len(table) == 2
    del dropped  # collected: its entry goes with it
    assert len(table) == 1
    assert table.get(kept) == "kept again"
    other = torch.zeros(4)
    assert table.get(other) is None and other not in table
    table.discard(kept)
    assert len(table) == 0 and table.get(kept) is None
