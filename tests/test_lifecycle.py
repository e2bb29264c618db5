"""The lifecycle contract: a trace belongs to the context that opened it (an asyncio task,
a thread), and closing blocks in any order restores exactly the state before them: no
shapeguard mode left on torch's stack, no module hook left, no guard that believes a trace
is open. The reproducers of issue 31 first, then a state machine that opens and closes
blocks in any order, guards and unguards, and runs forwards (right, with a shape bug,
raising) here, in other threads and in asyncio tasks.

SHAPEGUARD_LIFECYCLE_EXAMPLES sets the state machine's examples (CI: the default; the
long run: see docs/contributing.md).
"""

import asyncio
import os
import threading
import warnings

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)
from torch import nn

import shapeguard
from shapeguard._trace.current import current_session

pytestmark = pytest.mark.no_shapeguard  # inspects the mode stack and the hooks itself

B, TQ, TK, D = 2, 5, 7, 8  # distinct sizes: every axis can be told apart
_hooks = torch.nn.modules.module


def mode_stack() -> list:
    return torch.overrides._get_current_function_mode_stack()


class Cross(nn.Module):
    """Cross-attention with a projection: `softmax_dim=-2` is a silent bug (a finding),
    inputs of the wrong width a crash, `fail` an error of the model's own."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x, memory, softmax_dim=-1, fail=False):
        q = self.proj(x)
        if fail:
            raise KeyError("the model's own error")
        scores = q @ memory.transpose(-2, -1)
        return scores.softmax(softmax_dim) @ memory


EVENTS_PER_FORWARD = 5  # linear, transpose, matmul, softmax, matmul


def _inputs(seq_q: int = TQ):
    return torch.randn(B, seq_q, D), torch.randn(B, TK, D)


# -- the reproducers of issue 31 ------------------------------------------------------------
def test_blocks_closed_first_opened_first_leave_no_mode_and_guards_check_again():
    a, b = shapeguard.trace(), shapeguard.trace()
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    assert len(mode_stack()) == 1  # b is still open
    torch.randn(B, TQ) + 1
    b.__exit__(None, None, None)
    assert mode_stack() == []
    assert current_session() is None
    assert [e.op for e in b.events] == ["randn", "add"] and a.events == []
    with pytest.raises(shapeguard.ShapeError) as caught:
        shapeguard.guard(nn.Linear(3, 4))(torch.zeros(2, 5))
    assert "Linear(in_features=3)" in str(caught.value)
    assert "with 5 features" in str(caught.value)


def test_generators_holding_blocks_closed_in_the_order_they_started():
    def holding(sizes):
        with shapeguard.trace() as t:
            yield t
            for n in sizes:
                torch.zeros(n, 3).sum(0)
                yield t

    first, second = holding([2, 4]), holding([5])
    a, b = next(first), next(second)
    next(first)  # (2, 3) into b: the innermost block open in this context
    first.close()
    assert len(mode_stack()) == 1
    next(second)  # (5, 3) into b
    second.close()
    assert mode_stack() == [] and current_session() is None
    assert a.events == []
    assert [e.inputs[0].shape for e in b.events if e.op == "sum"] == [(2, 3), (5, 3)]


def test_asyncio_tasks_each_record_their_own_ops():
    model = Cross()

    async def request(seq_q: int):
        x, memory = _inputs(seq_q)
        with shapeguard.trace() as t:
            for _ in range(3):
                model(x, memory)
                await asyncio.sleep(0)  # the other task runs its forward here
        return t

    async def serve():
        return await asyncio.gather(request(4), request(6))

    traces = asyncio.run(serve())
    for seq_q, t in zip((4, 6), traces, strict=True):
        assert len(t.events) == 3 * EVENTS_PER_FORWARD
        shapes = {e.outputs[0].shape for e in t.events if e.op == "linear"}
        assert shapes == {(B, seq_q, D)}, "another task's ops leaked in"
    assert mode_stack() == [] and current_session() is None


def test_a_task_made_inside_a_block_records_into_it_and_is_outside_after_it():
    # As a span's context: a task made inside the block inherits it. Still running after
    # the block closed, it is outside any trace: a guard there checks on its own.
    async def main():
        opened, closed = asyncio.Event(), asyncio.Event()

        async def worker():
            torch.zeros(2, 3).sum()
            opened.set()
            await closed.wait()
            shapeguard.guard(nn.Linear(3, 4))(torch.zeros(2, 5))

        with shapeguard.trace() as t:
            task = asyncio.create_task(worker())
            await opened.wait()
        closed.set()
        with pytest.raises(shapeguard.ShapeError, match="with 5 features"):
            await task
        return t

    t = asyncio.run(main())
    assert [e.op for e in t.events] == ["zeros", "sum"]
    assert mode_stack() == []


def test_a_nested_block_sees_the_outer_one_as_its_parent():
    with shapeguard.trace() as outer:
        with shapeguard.trace() as inner:
            torch.zeros(2, 3).sum()
            assert current_session().trace is inner
            assert current_session()._previous.trace is outer
        assert current_session().trace is outer
        torch.ones(4)
    assert [e.op for e in inner.events] == ["zeros", "sum"]
    assert [e.op for e in outer.events] == ["ones"]


# -- the state machine -----------------------------------------------------------------------
EXAMPLES = int(os.environ.get("SHAPEGUARD_LIFECYCLE_EXAMPLES", "200"))
KINDS = ("right", "silent", "crash", "raises")  # what a forward does


class Lifecycle(RuleBasedStateMachine):
    """Blocks (`with shapeguard.trace()`) opened and closed in any order in this context,
    a model guarded and unguarded, forwards here, in a thread, and in asyncio tasks."""

    blocks = Bundle("blocks")

    @initialize()
    def start(self):
        assert mode_stack() == [], "a mode left by an earlier test"
        torch.manual_seed(0)
        self.model = Cross()
        self.x, self.memory = _inputs()
        self.wide = torch.randn(B, TQ, D + 3)
        with torch.no_grad():
            self.expected = {dim: self.model(self.x, self.memory, dim) for dim in (-1, -2)}
        self.open: list = []  # the blocks open in this context, in the order opened
        self.guarded = False
        self.counts: dict[int, tuple[int, int]] = {}  # id(block): (events, findings)
        self.closed: list = []  # closed blocks, which must never change again

    def teardown(self):
        for block in reversed(getattr(self, "open", [])):
            block.__exit__(None, None, None)
        if getattr(self, "guarded", False):
            shapeguard.unguard(self.model)
        assert mode_stack() == []

    # -- what a block holds -------------------------------------------------------------
    @staticmethod
    def _tally(block) -> tuple[int, int]:
        return len(block.events), sum(f.count for f in block.findings)

    def _expect_growth(self, innermost, findings: int, events: int) -> None:
        """Only the innermost open block grew, by `events` at least and `findings`."""
        for block in self.open:
            before = self.counts[id(block)]
            now = self._tally(block)
            if block is innermost:
                assert now[0] >= before[0] + events, (now, before)
                assert now[1] == before[1] + findings, (now, before)
            else:
                assert now == before, "a finding or event in another block than its own"
            self.counts[id(block)] = now

    # -- rules ----------------------------------------------------------------------------
    @rule(target=blocks)
    def open_block(self):
        block = shapeguard.trace(mode="warn")
        block.__enter__()
        self.open.append(block)
        self.counts[id(block)] = self._tally(block)
        return block

    @rule(block=consumes(blocks))
    def close_block(self, block):
        self.open.remove(block)
        block.__exit__(None, None, None)
        self.closed = [*self.closed[-7:], (block, self._tally(block))]

    @rule()
    def guard(self):
        if self.guarded:
            shapeguard.unguard(self.model)
        else:
            shapeguard.guard(self.model)
        self.guarded = not self.guarded

    @rule(kind=st.sampled_from(KINDS))
    def forward(self, kind):
        innermost = self.open[-1] if self.open else None
        before = shapeguard.last_trace(self.model)
        # A trace warns of a finding once, and counts its repeats.
        warns = innermost is None or "aggregation_axis" not in {f.kind for f in innermost.findings}
        outcome, out, caught = self._run(kind)
        if kind == "right":
            assert outcome is None and torch.equal(out, self.expected[-1])
        elif kind == "silent":
            assert outcome is None and torch.equal(out, self.expected[-2])
            checked = innermost is not None or self.guarded
            # Queries that are no keys: the product with V finds the softmax over them.
            assert [(w.message.kind, str(w.message).split(" sums ")[0]) for w in caught] == (
                [("aggregation_axis", "scores.softmax(softmax_dim) @ memory")]
                if checked and warns
                else []
            )
        elif kind == "crash":
            if innermost is not None or self.guarded:
                # A guard outside any trace checks as a trace does.
                assert isinstance(outcome, shapeguard.ShapeError), outcome
                assert "proj = Linear(in_features=8) got x with 11 features" in str(outcome)
            else:
                assert type(outcome) is RuntimeError  # plain torch: nothing checks
        else:
            assert isinstance(outcome, KeyError)
        findings = int(kind in ("silent", "crash"))
        if innermost is not None:
            events = 0 if kind == "crash" else 1
            self._expect_growth(innermost, findings, events)
        elif self.guarded and kind == "silent":
            last = shapeguard.last_trace(self.model)
            assert last is not before and [f.kind for f in last.findings] == ["aggregation_axis"]

    @rule(kind=st.sampled_from(("right", "silent", "crash")))
    def forward_in_a_thread(self, kind):
        # A thread starts with an empty context: no block of this one sees its ops.
        results: list = []
        with warnings.catch_warnings():  # the filters are the process's: set around it
            warnings.simplefilter("ignore", shapeguard.ShapeWarning)
            worker = threading.Thread(target=lambda: results.append(self._call(kind)))
            worker.start()
            worker.join(timeout=60)
        assert results, "the thread failed"
        outcome, out = results[0]
        if kind == "crash":
            expected = shapeguard.ShapeError if self.guarded else RuntimeError
            assert type(outcome) is expected, outcome
        else:
            assert outcome is None and torch.equal(
                out, self.expected[-1 if kind == "right" else -2]
            )
        self._expect_growth(None, 0, 0)

    @rule(seq_qs=st.lists(st.sampled_from((3, 4, 6)), min_size=1, max_size=3))
    def requests_in_asyncio_tasks(self, seq_qs):
        # Tasks that each open a block and await between forwards: each block holds its
        # own task's ops only, and the blocks of this context, their parents, none.
        model = self.model
        inputs = {n: _inputs(n) for n in seq_qs}  # made here: ops of this context's block

        async def request(seq_q):
            x, memory = inputs[seq_q]
            with shapeguard.trace() as t:
                for _ in range(2):
                    model(x, memory)
                    await asyncio.sleep(0)
            return t

        async def serve():
            return await asyncio.gather(*(request(n) for n in seq_qs))

        if self.open:
            self.counts[id(self.open[-1])] = self._tally(self.open[-1])
        traces = asyncio.run(serve())
        for seq_q, t in zip(seq_qs, traces, strict=True):
            assert len(t.events) == 2 * EVENTS_PER_FORWARD
            assert {e.outputs[0].shape for e in t.events if e.op == "linear"} == {(B, seq_q, D)}
        self._expect_growth(None, 0, 0)

    @precondition(lambda self: bool(self.open))
    @rule()
    def forward_in_a_task_inherits_the_block(self):
        async def task():
            return self.model(self.x, self.memory)

        out = asyncio.run(task())
        assert torch.equal(out, self.expected[-1])
        self._expect_growth(self.open[-1], 0, EVENTS_PER_FORWARD)

    # -- running a forward -----------------------------------------------------------------
    def _call(self, kind):
        x = self.wide if kind == "crash" else self.x
        try:
            with torch.no_grad():
                out = self.model(x, self.memory, -2 if kind == "silent" else -1, kind == "raises")
        except (shapeguard.ShapeError, RuntimeError, KeyError) as error:
            return error, None
        return None, out

    def _run(self, kind):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome, out = self._call(kind)
        return outcome, out, [w for w in caught if issubclass(w.category, shapeguard.ShapeWarning)]

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def the_stack_and_the_hooks_are_what_the_open_blocks_imply(self):
        if not hasattr(self, "open"):
            return
        stack = mode_stack()
        if self.open:
            assert len(stack) == 1 and getattr(stack[0], "shapeguard_interceptor", False)
        else:
            assert stack == []
        assert len(_hooks._global_forward_pre_hooks) == len(self.open)
        assert len(_hooks._global_forward_hooks) == len(self.open)
        assert shapeguard.is_guarded(self.model) == self.guarded
        assert ("forward" in self.model.__dict__) == self.guarded  # the guard's, on the instance
        assert not self.model._forward_hooks and not self.model._forward_pre_hooks

    @invariant()
    def the_innermost_open_block_is_the_current_trace(self):
        if not hasattr(self, "open"):
            return
        session = current_session()
        if self.open:
            assert session is not None and session.trace is self.open[-1]
        else:
            assert session is None  # no guard believes a trace is open

    @invariant()
    def closed_blocks_never_change(self):
        for block, tally in getattr(self, "closed", []):
            assert self._tally(block) == tally


Lifecycle.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_lifecycle_in_any_order = Lifecycle.TestCase
