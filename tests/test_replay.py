"""Sessions that repeat are replayed (`shapeguard/_trace/replay.py`), and a replay changes nothing.

A session of an opener (a model given to `trace`, a guarded module, a `with trace():` line)
is recorded the second time it runs and replayed from the third on, as long as its steps
repeat. Every test here compares a replayed trace with the trace the same calls make with
replay off (`SHAPEGUARD_REPLAY=0`): the same events, names, roles, findings and outputs,
over the bug zoo (bugs and fixes, at pairwise-distinct and coincident sizes), the correct
models, and one configuration of every real-model family. Then the cases where a replay
must stop: other shapes, other mask values, another line, a module entered in another
order, a tensor made elsewhere, a finding.
"""

import gc
import warnings

import bug_zoo as zoo
import pytest
import torch
from test_invariants import BUGS, CORRECT
from torch import nn

import shapeguard
from shapeguard import ShapeWarning
from shapeguard._trace import replay as _replay

pytestmark = pytest.mark.no_shapeguard  # the plugin's own session would hold every op


@pytest.fixture(autouse=True)
def _fresh_recordings():
    _replay.forget_all()
    yield
    _replay.forget_all()


def _trace(model, args, kwargs=None):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", ShapeWarning)
        return shapeguard.trace(model, *args, mode="warn", **(kwargs or {}))


def _reference(monkeypatch, model, args, kwargs=None):
    with monkeypatch.context() as m:
        m.setenv("SHAPEGUARD_REPLAY", "0")
        return _trace(model, args, kwargs)


def _same(replayed, reference):
    assert replayed.to_dict() == reference.to_dict()
    assert [r.role for e in replayed.events for r in e.outputs] == [
        r.role for e in reference.events for r in e.outputs
    ]


def _replays(monkeypatch, model, args, fresh_args=None):
    """Trace three times (the third replays), then once more on other tensors of the
    same shapes; each trace equals the one replay off gives."""
    reference = _reference(monkeypatch, model, args)
    first, second, third = (_trace(model, args) for _ in range(3))
    for t in (first, second, third):
        _same(t, reference)
    assert first._replayed == second._replayed == 0
    if fresh_args is not None:
        fourth = _trace(model, fresh_args)
        _same(fourth, _reference(monkeypatch, model, fresh_args))
    return third


def _fresh(args):
    """Other tensors of the same shapes: new values, the same masks."""
    torch.manual_seed(1)
    return tuple(
        torch.randn_like(a) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )


SETTINGS = pytest.mark.parametrize("sizes", [zoo.DISTINCT, zoo.COINCIDENT], ids=lambda s: s.name)


@SETTINGS
@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_a_bug_replays_to_the_same_findings(bug, sizes, monkeypatch):
    model, args = bug.make(sizes, bug.name)
    if not bug.silent(sizes):
        return  # a loud bug raises before the session ends: nothing to replay
    third = _replays(monkeypatch, model, args, _fresh(args))
    assert third.findings  # replayed up to the finding, which is found again


@SETTINGS
@pytest.mark.parametrize("bug", BUGS, ids=str)
def test_fixed_code_replays_whole(bug, sizes, monkeypatch):
    model, args = bug.make(sizes, None)
    third = _replays(monkeypatch, model, args, _fresh(args))
    # A plain function has no opener; torch's composites are checked at their boundary.
    if isinstance(model, nn.Module) and not type(model).__module__.startswith("torch.nn"):
        assert third._replayed > 0


@SETTINGS
@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_model_replays(name, sizes, monkeypatch):
    model, args = CORRECT[name](sizes)
    _replays(monkeypatch, model, args, _fresh(args))


def _real_configs():
    import real_models

    seen, picked = set(), []
    for config in real_models.configs():
        if config.family not in seen and config.sizes == "distinct":
            seen.add(config.family)
            picked.append(pytest.param(config, id=config.id))
    return picked


@pytest.mark.parametrize("config", _real_configs())
def test_a_real_model_replays(config, monkeypatch):
    import real_models

    if config.id not in real_models.TORCH_IDS:
        pytest.importorskip("transformers")
    model, args, kwargs = real_models.build(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = _reference(monkeypatch, model, args, kwargs)
        traces = [_trace(model, args, kwargs) for _ in range(3)]
    for t in traces:
        _same(t, reference)
    if config.id not in real_models.TORCH_IDS:  # torch's composites: checked at the boundary
        assert traces[2]._replayed > 0


# -- where a replay stops ----------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, d_model=12, n_heads=3):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / (C // self.n_heads) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(B, T, C))


def _steps(model, *args):
    return [_trace(model, args) for _ in range(3)]


def test_the_third_session_replays_every_step():
    model = Attention()
    x = torch.randn(2, 5, 12)
    first, second, third = _steps(model, x)
    assert third._replayed == third._steps > len(third.events)  # modules entered and left
    assert third.to_dict() == first.to_dict()


def test_other_shapes_are_not_replayed(monkeypatch):
    model = Attention()
    _steps(model, torch.randn(2, 5, 12))
    x = torch.randn(2, 6, 12)
    other = _trace(model, (x,))
    assert other._replayed == 0  # the first step names the input, of another shape
    _same(other, _reference(monkeypatch, model, (x,)))


def test_other_mask_values_are_read_again(monkeypatch):
    model = Attention()
    x = torch.randn(2, 5, 12)
    full = torch.ones(2, 5, dtype=torch.long)
    _steps(model, x, full)
    padded = full.clone()
    padded[1, 3:] = 0
    other = _trace(model, (x, padded))  # the mask's rules run again: clean, so replayed
    assert other._replayed == other._steps
    _same(other, _reference(monkeypatch, model, (x, padded)))


def test_mask_values_with_a_finding_stop_the_replay(monkeypatch):
    model = Attention()
    x = torch.randn(2, 5, 12)
    _steps(model, x, torch.ones(2, 5, dtype=torch.long))
    empty = torch.ones(2, 5, dtype=torch.long)
    empty[1] = 0  # every key of example 1 hidden: a fully masked row
    other = _trace(model, (x, empty))
    assert other.findings
    assert 0 < other._replayed < other._steps
    _same(other, _reference(monkeypatch, model, (x, empty)))


def test_a_with_block_replays_per_line(monkeypatch):
    model = Attention()
    x = torch.randn(2, 5, 12)

    def run():
        with torch.no_grad(), shapeguard.trace() as t:
            model(x)
        return t

    first, _, third = run(), run(), run()
    assert third._replayed > 0
    _same(third, first)


def test_a_guarded_module_replays_every_call():
    model = shapeguard.guard(Attention())
    x = torch.randn(2, 5, 12)
    for _ in range(3):
        with torch.no_grad():
            model(x)
    trace = shapeguard.last_trace(model)
    assert trace._replayed == trace._steps > 0


def test_a_finding_is_a_barrier():
    class Carve(Attention):
        def forward(self, x):
            B, T, C = x.shape
            q = self.qkv(x)[..., :C].reshape(B, self.n_heads, T, C // self.n_heads)  # carve
            return q.sum()

    model = Carve(12, 3)
    x = torch.randn(3, 3, 12)  # seq == heads: a legal view that mixes the tokens
    traces = _steps(model, x)
    assert [len(t.findings) for t in traces] == [1, 1, 1]
    assert 0 < traces[2]._replayed < traces[2]._steps
    assert traces[2].to_dict() == traces[0].to_dict()


def test_a_shared_line_keeps_a_recording_per_model():
    models = [Attention(), Attention(12, 4)]
    x = torch.randn(2, 5, 12)

    def run(model):
        with torch.no_grad(), shapeguard.trace() as t:
            model(x)
        return t

    for _ in range(3):
        traces = [run(m) for m in models]
    assert all(t._replayed > 0 for t in traces)


def test_replay_off_replays_nothing(monkeypatch):
    monkeypatch.setenv("SHAPEGUARD_REPLAY", "0")
    model = Attention()
    traces = _steps(model, torch.randn(2, 5, 12))
    assert [t._replayed for t in traces] == [0, 0, 0]


def test_numbers_no_rule_reads_do_not_stop_a_replay():
    # An optimizer's step size changes every step: elementwise ops with no rule ignore it.
    model = nn.Linear(4, 4)

    def step(scale):
        with torch.no_grad(), shapeguard.trace() as t:
            (model(torch.ones(2, 4)) * scale).relu().clamp(min=scale)
        return t

    traces = [step(s) for s in (0.5, 0.25, 0.125)]
    assert traces[2]._replayed == traces[2]._steps > 0


class _SplitHeads(nn.Module):
    """A helper whose returned value its caller names (`Q = self.split(...)`)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 12)

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], 3, 4).transpose(1, 2)

    def forward(self, x):
        Q = self.split(self.proj(x))
        return Q.softmax(dim=-1)


def test_a_helper_named_by_its_caller_replays(monkeypatch):
    # The site of a helper's `return` is named by the caller's line: the same site object
    # each call, or a replay (which compares sites by identity) could never match it.
    model = _SplitHeads()
    x = torch.randn(2, 5, 12)
    third = _replays(monkeypatch, model, (x,))
    assert third._replayed == third._steps
    assert "Q" in [r.label for e in third.events for r in e.outputs]


class _TwoLines(nn.Module):
    """One projection called from two lines, in an order `swap` chooses."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 12)
        self.swap = False

    def forward(self, x):
        for turn in range(2):
            if (turn == 0) != self.swap:
                first = self.proj(x)
            else:
                second = self.proj(x).softmax(dim=-1)
        return first + second


def test_the_same_op_from_another_line_is_not_replayed(monkeypatch):
    # A replayed step knows its user's frame by code object and instruction: the same
    # module, op and inputs at another line of the same loop is another step.
    model = _TwoLines()
    x = torch.randn(2, 5, 12)
    _steps(model, x)
    model.swap = True
    other = _trace(model, (x,))
    assert 0 < other._replayed < other._steps
    reference = _reference(monkeypatch, model, (x,))
    _same(other, reference)
    labels = [r.label for e in other.events for r in e.outputs]
    assert labels.index("second") < labels.index("first")


_EDITED = """
import torch
from torch import nn


def forward(self, x):
    {name} = self.proj(x)
    return {name}.softmax(dim=-1)
"""


def _forward_from(path, name: str, stamp: int):
    import importlib.util
    import os
    import textwrap

    path.write_text(textwrap.dedent(_EDITED.format(name=name)))
    os.utime(path, ns=(stamp, stamp))
    spec = importlib.util.spec_from_file_location(f"replay_edited_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.forward


def test_a_forward_edited_between_two_traces_is_not_replayed(tmp_path, monkeypatch):
    # The same module, the same lines and instructions, another code object (the file
    # edited and loaded again): the recorded sites, and their names, are not reused.
    path = tmp_path / "edited_forward.py"

    class Edited(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(12, 12)

    model = Edited()
    x = torch.randn(2, 3, 12)
    monkeypatch.setattr(Edited, "forward", _forward_from(path, "scores", 1_000_000_000), False)
    traces = _steps(model, x)
    assert traces[2]._replayed == traces[2]._steps
    monkeypatch.setattr(Edited, "forward", _forward_from(path, "logits", 2_000_000_000), False)
    edited = _trace(model, (x,))
    assert edited._replayed < edited._steps
    assert [e.outputs[0].label for e in edited.events] == ["logits", "output"]
    _same(edited, _reference(monkeypatch, model, (x,)))


class _Arguments(nn.Module):
    """Ops whose arguments besides their input tensors a test changes between traces (on
    a cube, so that no output shape tells the change)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(12, 12)
        self.dim = -1
        self.order = (0, 2, 1)
        self.square = True

    def forward(self, x):
        h = self.proj(x).permute(*self.order)
        h = h * (h if self.square else 2.0)
        return torch.softmax(h, dim=self.dim)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(("dim", 1), id="a keyword argument"),
        pytest.param(("order", (0, 1, 2)), id="positional numbers"),
        pytest.param(("square", False), id="a tensor turned number"),
    ],
)
def test_other_arguments_at_the_same_line_are_not_replayed(change, monkeypatch):
    # A step compares its arguments in compiled code (`_replay_match.matcher`): each kind of
    # change at the same line stops the replay there, and the trace is the usual one.
    model = _Arguments()
    x = torch.randn(2, 12, 12)
    third = _steps(model, x)[2]
    assert third._replayed == third._steps
    setattr(model, *change)
    other = _trace(model, (x,))
    assert other._replayed < other._steps
    _same(other, _reference(monkeypatch, model, (x,)))


def test_a_closed_session_leaves_no_reference_cycle():
    # The mode and its session held each other (and the trace's events hung off them):
    # the garbage collector had some hundred objects per forward to free.
    model = shapeguard.guard(Attention())
    x = torch.randn(2, 5, 12)
    with torch.no_grad():
        model(x)
    gc.collect()
    gc.disable()
    try:
        for _ in range(4):  # recorded, then replayed
            with torch.no_grad():
                model(x)
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_parameter_in_another_layout_is_not_replayed(monkeypatch):
    # A parameter is first seen in each session: the step compares the very tensor and
    # its layout (strides, device, requires_grad), in compiled code (`_replay_match.matcher`).
    model = Attention()
    x = torch.randn(2, 5, 12)
    _steps(model, x)
    model.qkv.weight.requires_grad_(False)
    other = _trace(model, (x,))
    assert other._replayed < other._steps
    _same(other, _reference(monkeypatch, model, (x,)))


def test_a_parameter_replaced_by_one_of_its_kind_replays(monkeypatch):
    # Another tensor where the recorded one was: the generic comparison decides (the same
    # name, kind and layout: the same step).
    model = Attention()
    x = torch.randn(2, 5, 12)
    _steps(model, x)
    model.qkv.weight = nn.Parameter(torch.randn(36, 12))
    other = _trace(model, (x,))
    assert other._replayed == other._steps
    _same(other, _reference(monkeypatch, model, (x,)))


def test_the_tensor_table_sweeps_collected_tensors():
    # No callback per entry (it cost more than the entry): a table drops the entries of
    # collected tensors when it has doubled since its last sweep, and never reads one.
    from shapeguard._trace.meta import _SWEEP_AT, TensorTable

    table = TensorTable()
    kept = [torch.zeros(1) for _ in range(10)]
    for i, t in enumerate(kept):
        table[t] = i
    for i in range(_SWEEP_AT):
        table[torch.zeros(1)] = -i  # collected at once
    assert len(table._data) <= _SWEEP_AT
    assert [table.get(t) for t in kept] == list(range(10))
    assert len(table) == 10
    fresh = torch.zeros(1)
    assert table.get(fresh) is None and fresh not in table
