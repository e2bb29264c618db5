"""A trace around a training step: the model's ops are recorded and checked, the ops
torch.optim makes itself (an optimizer's step, a dozen in-place ops per parameter) are
run as they are, neither checked nor recorded (`_source.op_site`)."""

import collections
import copy

import bug_zoo as zoo
import pytest
import torch
from torch import nn

import shapeguard

STEP_LINE = "optimizer.step()  # <- step"


def _step_line() -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.strip() == STEP_LINE)


def _train(model, optimizer, x, mask, steps: int = 1) -> None:
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(x, attention_mask=mask).pow(2).mean()
        loss.backward()
        optimizer.step()  # <- step


def _model(sizes: zoo.Sizes, bug=None):
    torch.manual_seed(0)
    return zoo.TutorialMHA(sizes.d_model, sizes.heads, bug=bug)


def _inputs(sizes: zoo.Sizes):
    torch.manual_seed(1)
    return torch.randn(sizes.batch, sizes.seq, sizes.d_model), zoo.attention_mask(sizes)


def _locations(trace) -> collections.Counter:
    return collections.Counter(e.location.rpartition(":")[2] for e in trace.events)


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
def test_a_training_step_records_the_model_and_not_the_optimizer(sizes):
    x, mask = _inputs(sizes)
    model = _model(sizes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with shapeguard.trace() as step:
        _train(model, optimizer, x, mask)
    forward_only = _model(sizes)
    with shapeguard.trace() as alone:
        forward_only(x, attention_mask=mask).pow(2).mean().backward()

    assert step.findings == [] and alone.findings == []
    assert str(_step_line()) not in _locations(step)
    # The same ops as the forward and backward without an optimizer: the step adds none.
    assert [(e.op, [i.shape for i in e.inputs]) for e in step.events] == [
        (e.op, [i.shape for i in e.inputs]) for e in alone.events
    ]


@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
def test_steps_traced_one_after_another_replay_and_train_as_untraced(sizes):
    x, mask = _inputs(sizes)
    model = _model(sizes)
    untraced = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    reference = torch.optim.AdamW(untraced.parameters(), lr=1e-2)
    traces = []
    for _ in range(4):
        with shapeguard.trace() as t:  # one line: its sessions replay once they repeat
            _train(model, optimizer, x, mask)
        traces.append(t)
    _train(untraced, reference, x, mask, steps=4)

    assert traces[-1]._replayed > 0, "the optimizer's ops broke the replay"
    assert all(t.findings == [] for t in traces)
    assert len({t.event_count for t in traces}) == 1
    for (name, p), q in zip(model.named_parameters(), untraced.parameters(), strict=True):
        assert torch.equal(p, q), name
    for state, expected in zip(optimizer.state.values(), reference.state.values(), strict=True):
        assert torch.equal(state["exp_avg_sq"], expected["exp_avg_sq"])


@pytest.mark.no_shapeguard  # it provokes the warnings it asserts
@pytest.mark.parametrize("sizes", zoo.SETTINGS, ids=lambda s: s.name)
@pytest.mark.parametrize("bug", ["mask_axis", "carve"])
def test_a_bug_in_the_forward_of_a_training_step_is_found_there(sizes, bug):
    x, mask = _inputs(sizes)
    model = _model(sizes, bug)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.warns(shapeguard.ShapeWarning), shapeguard.trace(mode="warn") as step:
        _train(model, optimizer, x, mask)
    with pytest.warns(shapeguard.ShapeWarning), shapeguard.trace(mode="warn") as alone:
        _model(sizes, bug)(x, attention_mask=mask)

    assert step.findings, f"{bug} at {sizes.name}: no finding in the training step"
    assert [(f.kind, f.location) for f in step.findings] == [
        (f.kind, f.location) for f in alone.findings
    ]
    # At the bug's own line in the model (the zoo marks it), never the optimizer's.
    first = step.findings[0]
    path, _, line = first.location.rpartition(":")
    with open(path) as f:
        text = f.readlines()[int(line) - 1]
    assert f"# <- {bug}" in text, (first.location, text)
    assert first.message.splitlines()[1].strip().startswith("in  TutorialMHA at")


class _PlainSGD(torch.optim.Optimizer):
    """An optimizer written in the user's own code: its ops are the user's, and traced."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])  # <- own step


def test_an_optimizer_of_the_users_own_is_traced():
    model = nn.Linear(3, 2)
    optimizer = _PlainSGD(model.parameters(), lr=0.1)
    with shapeguard.trace() as t:
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
    with open(__file__) as f:
        own = next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# <- own step"))
    assert _locations(t)[str(own)] == 2  # weight and bias
    assert [e.op for e in t.events if e.location.endswith(f":{own}")] == ["add_", "add_"]


def test_a_model_that_torch_optim_runs_is_still_the_models():
    # swa_utils.AveragedModel is torch.optim code whose forward calls the model: the
    # model's ops are recorded (only torch.optim's own ops are not).
    averaged = torch.optim.swa_utils.AveragedModel(nn.Linear(3, 2))
    x = torch.randn(4, 3)
    with shapeguard.trace() as t:
        averaged(x)
    assert [e.op for e in t.events] == ["linear"]
    assert [tuple(o.shape) for o in t.events[0].outputs] == [(4, 2)]
