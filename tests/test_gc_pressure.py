"""What a trace keeps per recorded op, counted in objects Python's collector tracks.

The 3.11 collector runs a young collection per some 700 tracked objects made and not yet
freed, and a full one (a walk over every tracked object of the process: 0.2 s in the
project's own suite) per some 70,000. Objects a trace keeps until its end count towards
them, so a traced test or training loop that kept many per op paid for full collections
an untraced one never makes. Not a timing: the count is exact and the same on any machine.
"""

import gc
import os
import sys

import pytest
import torch

import shapeguard
from shapeguard._public_trace import Trace

sys.path.insert(0, os.path.dirname(__file__))
import real_models  # noqa: E402
from attention_models import CausalSelfAttention  # noqa: E402

# The counts are of the trace each case opens itself, not of the plugin's around it.
pytestmark = pytest.mark.no_shapeguard

# A recorded op keeps its event (one tuple, and one of its tensors' metas), its outputs'
# metas (a meta, its new axes and a weak table entry each): 7 to 10.5 in these cases; a
# replayed op's meta has no axes until they are read (`_trace/owed.py`): 5 for the
# replayed nanoGPT stack. It was 15 to 20 when every event kept its own torch.Size and
# tuple per tensor, two lists of metas, and an empty frozenset per output.
KEPT_PER_OP = 12


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def _kept_per_op(run, *, background: bool) -> float:
    """Tracked objects a trace holds after `run()`, per op it recorded (tuples of plain
    values, which a collection stops tracking, not counted). The third trace of a block
    is measured: the first pays one-time caches, the second records the steps a trace
    opened again at the same place replays (`_replay`; kept once per place, not per op)."""
    with torch.no_grad():
        for _ in range(3):
            before = _tracked()
            with Trace(mode="warn", background=background) as trace:
                run()
                after = _tracked()
                ops = trace.event_count
            del trace  # freed before the next round's count
    if ops < 20:
        raise RuntimeError(f"the case recorded only {ops} ops")
    return (after - before) / ops


def _llama(sizes: str):
    config = real_models.Config(f"llama-eager-left-{sizes}", "llama", "eager", "left", sizes)
    model, args, kwargs = real_models.build(config)
    return lambda: model(*args, **kwargs)


def _nanogpt_stack(batch, seq, heads, d_k):
    """Four nanoGPT-style attention layers (unguarded: the trace records every op)."""
    torch.manual_seed(0)
    layers = [CausalSelfAttention(heads * d_k, heads, block_size=seq) for _ in range(4)]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(batch, seq, heads * d_k)
    return lambda: model(x)


CASES = {
    "llama-distinct": lambda: _llama("distinct"),
    "llama-coincident": lambda: _llama("coincident"),
    "nanogpt-realistic": lambda: _nanogpt_stack(4, 64, 8, 64),
}


@pytest.mark.parametrize("background", [False, True], ids=["trace", "background"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_recorded_op_keeps_few_tracked_objects(case, background):
    kept = _kept_per_op(CASES[case](), background=background)
    assert kept <= KEPT_PER_OP, f"{kept:.1f} tracked objects kept per recorded op"


def test_events_of_alike_tensors_share_what_they_keep_and_read_their_own():
    """Events share what they keep of tensors alike; each still reads its own shape,
    dtype and name."""
    a, b = torch.randn(3, 5), torch.randn(3, 5, dtype=torch.float64)
    with shapeguard.trace() as trace:
        x = a * 2
        y = a + 1
        z = b * 2
    first, second, third = trace.events
    assert first.inputs[0].shape == second.inputs[0].shape == (3, 5)
    assert (first.outputs[0].dtype, third.outputs[0].dtype) == ("float32", "float64")
    assert [e.outputs[0].label for e in trace.events] == ["x", "y", "z"]
    del x, y, z
