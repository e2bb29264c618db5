"""guard / unguard / trace: correct modules stay silent, outputs are untouched, and nothing
(hooks, modes, tensors) is left behind."""

import gc
import os
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from attention_models import (
    SDPAGQA,
    SK,
    SQ,
    B,
    CausalSelfAttention,
    CrossAttention,
    D,
    GQAttention,
    H,
    HandAttention,
)
from jaxtyping import Float
from torch import nn

import shapeguard

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import seed_mha  # noqa: E402


def _correct_cases():
    x = torch.randn(B, SQ, D)
    memory = torch.randn(B, SK, D)
    mask = torch.tril(torch.ones(SQ, SQ, dtype=torch.bool)).expand(B, 1, SQ, SQ)
    return [
        (
            "seed_mha",
            lambda: seed_mha.MultiHeadAttention(d_model=D, n_heads=H),
            (x,),
            {"mask": mask},
        ),
        ("hand", HandAttention, (x,), {}),
        ("nanogpt_causal", CausalSelfAttention, (x,), {}),
        ("cross_attention", CrossAttention, (x, memory), {}),
        (
            "cross_attention_padding",
            CrossAttention,
            (x, memory, torch.ones(B, SK, dtype=torch.bool)),
            {},
        ),
        ("gqa_repeat_kv", GQAttention, (torch.randn(B, SQ, 66),), {}),
        ("gqa_sdpa", SDPAGQA, (torch.randn(B, SQ, 66),), {}),
        (
            "torch_mha_batch_first",
            lambda: nn.MultiheadAttention(D, H, batch_first=True),
            (x, memory, memory),
            {"key_padding_mask": torch.zeros(B, SK, dtype=torch.bool)},
        ),
        (
            "torch_mha_seq_first",
            lambda: nn.MultiheadAttention(D, H),
            (x.transpose(0, 1), memory.transpose(0, 1), memory.transpose(0, 1)),
            {"attn_mask": torch.zeros(SQ, SK, dtype=torch.bool)},
        ),
        (
            "transformer_encoder_layer",
            lambda: nn.TransformerEncoderLayer(D, H, dim_feedforward=17, batch_first=True),
            (x,),
            {},
        ),
    ]


CORRECT = _correct_cases()


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize(
    ("build", "args", "kwargs"), [c[1:] for c in CORRECT], ids=[c[0] for c in CORRECT]
)
def test_correct_modules_give_zero_findings(build, args, kwargs, device):
    torch.manual_seed(0)
    model = build().to(device)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    trace = shapeguard.trace(model, *args, **kwargs)
    assert trace.findings == []
    assert trace.events, "the trace saw no op"


@pytest.mark.parametrize(
    ("build", "args", "kwargs"), [c[1:] for c in CORRECT], ids=[c[0] for c in CORRECT]
)
def test_guarded_output_is_bitwise_identical(build, args, kwargs):
    torch.manual_seed(0)
    model = build().eval()
    expected = model(*args, **kwargs)
    shapeguard.guard(model)
    try:
        actual = model(*args, **kwargs)
    finally:
        shapeguard.unguard(model)
    expected = expected[0] if isinstance(expected, tuple) else expected
    actual = actual[0] if isinstance(actual, tuple) else actual
    assert torch.equal(actual, expected)


def _hook_counts(module):
    """Per module: its hooks, and whether it has a forward of its own (the guard's wrapper)."""
    return [
        (
            len(m._forward_pre_hooks),
            len(m._forward_hooks),
            len(m._forward_hooks_always_called),
            "forward" in m.__dict__,
        )
        for m in module.modules()
    ]


def _global_hook_counts():
    hooks = torch.nn.modules.module
    return (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks))


def test_unguard_restores_exactly_the_hooks_the_module_had():
    model = HandAttention()
    user_handle = model.register_forward_hook(lambda m, a, o: None)
    before = _hook_counts(model)
    shapeguard.guard(model)
    assert shapeguard.is_guarded(model)
    assert _hook_counts(model) != before
    shapeguard.unguard(model)
    assert _hook_counts(model) == before
    assert not shapeguard.is_guarded(model)
    user_handle.remove()


@pytest.mark.no_shapeguard
def test_exception_inside_guarded_forward_leaves_no_hook_and_no_mode():
    model = shapeguard.guard(HandAttention(bug="k_not_transposed"))
    before_module, before_global = _hook_counts(model), _global_hook_counts()
    for _ in range(2):
        with pytest.raises(shapeguard.ShapeError):
            model(torch.randn(B, SQ, D))
        assert _hook_counts(model) == before_module
        assert _global_hook_counts() == before_global
        assert not torch.overrides._is_torch_function_mode_enabled()
    from shapeguard._trace.current import current_session

    assert current_session() is None


@pytest.mark.no_shapeguard
def test_trace_context_manager_removes_everything_on_exception():
    before = _global_hook_counts()
    with pytest.raises(ZeroDivisionError), shapeguard.trace():
        assert torch.overrides._is_torch_function_mode_enabled()
        raise ZeroDivisionError
    assert _global_hook_counts() == before
    assert not torch.overrides._is_torch_function_mode_enabled()


@pytest.mark.no_shapeguard
def test_class_decorator_forms():
    @shapeguard.guard
    class Plain(HandAttention):
        pass

    @shapeguard.guard(mode="warn")
    class Warned(HandAttention):
        pass

    plain, warned = Plain(bug="k_not_transposed"), Warned(bug="softmax_axis")
    assert shapeguard.is_guarded(plain) and shapeguard.is_guarded(warned)
    with pytest.raises(shapeguard.ShapeError, match="K was not transposed"):
        plain(torch.randn(B, SQ, D))
    with pytest.warns(shapeguard.ShapeWarning, match="softmax over seq_q"):
        warned(torch.randn(B, SQ, D))


def test_guard_rejects_bad_use_with_a_clear_message():
    with pytest.raises(shapeguard.ContractError, match="nn.Module class or instance, not int"):
        shapeguard.guard(3)
    with pytest.raises(shapeguard.ContractError, match=r"mode='loud' is not a shapeguard mode"):
        shapeguard.guard(HandAttention(), mode="loud")
    with pytest.raises(
        shapeguard.ContractError, match="decorates nn.Module subclasses; str is not one"
    ):
        shapeguard.guard(str)


def test_trace_context_checks_any_code_and_records_roles():
    model = HandAttention()  # not guarded
    with shapeguard.trace() as trace:
        model(torch.randn(B, SQ, D))
    assert trace.shape_of("scores") == (B, H, SQ, SQ)
    assert trace.shape_of("Q") == (B, H, SQ, D // H)
    assert trace.shape_of("context") == (B, SQ, D)
    scores = trace.records("scores")[0]
    assert scores.axes == ("batch", "heads", "seq_q", "seq_k")
    assert scores.named_shape == "[batch=2, heads=3, seq_q=5, seq_k=5]"
    table = trace.table(width=160)
    assert "[batch=2, heads=3, seq_q=5, seq_k=5]" in table
    assert "scores" in table and "context" in table
    assert "0 errors, 0 warnings" in table


@pytest.mark.no_shapeguard
def test_module_paths_in_events_and_messages():
    class Block(nn.Module):
        def __init__(self, bug=None):
            super().__init__()
            self.attn = HandAttention(bug=bug)

        def forward(self, x):
            return x + self.attn(x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(), Block(bug="k_not_transposed")])

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.trace(Model(), torch.randn(B, SQ, D))
    assert "in  blocks.1.attn (HandAttention) at tests/attention_models.py:" in str(info.value)
    assert info.value.module == "blocks.1.attn (HandAttention)"
    trace = shapeguard.trace(Model().blocks[0], torch.randn(B, SQ, D))
    assert {e.module for e in trace.events} >= {"attn", "attn.W_q", "attn.out"}


@pytest.mark.no_shapeguard
def test_disable_and_env_switch_make_guard_a_pass_through(monkeypatch):
    model = shapeguard.guard(HandAttention(bug="k_not_transposed"))
    x = torch.randn(B, SQ, D)
    shapeguard.disable()
    try:
        assert not shapeguard.is_enabled()
        with pytest.raises(RuntimeError) as info:
            model(x)
        assert not isinstance(info.value, shapeguard.ShapeError)  # torch's own error
    finally:
        shapeguard.enable()
    monkeypatch.setenv("SHAPEGUARD", "0")  # read at call time
    with pytest.raises(RuntimeError) as info:
        model(x)
    assert not isinstance(info.value, shapeguard.ShapeError)
    monkeypatch.setenv("SHAPEGUARD", "1")
    with pytest.raises(shapeguard.ShapeError):
        model(x)


def test_long_trace_keeps_no_tensor_alive():
    model = HandAttention()
    refs = []
    with shapeguard.trace() as trace:
        for _ in range(30):
            x = torch.randn(B, SQ, D)
            refs.append(weakref.ref(x))
            out = model(x)
            refs.append(weakref.ref(out))
            del x, out
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(trace.events) == 30 * 19  # randn + the 18 ops of a forward
    for event in trace.events:
        for record in (*event.inputs, *event.outputs):
            assert all(isinstance(s, int) for s in record.shape)
            assert not any(isinstance(v, torch.Tensor) for v in vars(type(record)).values())


def test_to_json_is_versioned_and_holds_shapes():
    import json

    trace = shapeguard.trace(HandAttention(), torch.randn(B, SQ, D))
    data = json.loads(trace.to_json())
    assert data["schema"] == "shapeguard.trace" and data["schema_version"] == 2
    assert data["events"][0]["outputs"][0]["shape"] == [B, SQ, D]
    assert data["events"][0]["op"] == "linear"
    assert data["findings"] == []


def test_guarded_nested_modules_share_one_trace():
    @shapeguard.guard
    class Inner(HandAttention):
        pass

    @shapeguard.guard
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x) * 2

    outer = Outer()
    outer(torch.randn(B, SQ, D))
    trace = shapeguard.last_trace(outer)
    assert trace is not None and trace.findings == []
    assert trace.events[-1].op == "mul"
    assert shapeguard.last_trace(outer.inner) is None  # it ran inside the outer trace


@pytest.mark.no_shapeguard
def test_compile_of_guarded_model_matches_eager():
    torch.manual_seed(0)
    model = shapeguard.guard(HandAttention().eval())
    x = torch.randn(B, SQ, D)
    eager = model(x)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), eager)
    torch._dynamo.reset()


@pytest.mark.no_shapeguard
def test_sdpa_users_are_checked_inside_guarded_module():
    class SDPAUser(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = H
            self.qkv = nn.Linear(D, 3 * D)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, D // H).unbind(2)
            # forgot .transpose(1, 2): SDPA reads [batch, seq, heads, d_k] as
            # [batch, heads, seq, d_k], so dropping the last token of v drops a "head"
            return F.scaled_dot_product_attention(q, k, v[:, :-1])

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.guard(SDPAUser())(torch.randn(B, SQ, D))
    assert info.value.kind == "sdpa_heads"
    assert str(info.value).splitlines()[0] == (
        "scaled_dot_product_attention: k.heads (5) != v[:, :-1].heads (4)"
    )
    assert info.value.hint == (
        "q looks like [batch, seq, heads, d_k] (heads=3 on axis 2); SDPA wants "
        "[batch, heads, seq, d_k]: pass q.transpose(1, 2) (and the same for k and v)"
    )


def test_guard_changes_no_user_state_rng_mode_or_weights():
    layer = nn.TransformerEncoderLayer(D, H, dim_feedforward=17, dropout=0.25, batch_first=True)
    x = torch.randn(B, SQ, D)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    torch.manual_seed(7)
    expected = layer(x)
    rng_after_plain = torch.get_rng_state()
    shapeguard.guard(layer)
    torch.manual_seed(7)
    actual = layer(x)  # train mode: dropout draws from the RNG
    assert torch.equal(actual, expected)
    assert torch.equal(torch.get_rng_state(), rng_after_plain)
    assert layer.training
    assert all(torch.equal(v, state[k]) for k, v in layer.state_dict().items())
    shapeguard.unguard(layer)


@pytest.mark.no_shapeguard  # warns on purpose
def test_nested_trace_checks_each_op_once_and_background_collects_findings():
    model = HandAttention(bug="softmax_axis")
    guarded = shapeguard.guard(HandAttention(bug="softmax_axis"), mode="warn")
    outer = shapeguard.Trace(background=True)
    with outer, pytest.warns(shapeguard.ShapeWarning):
        inner = shapeguard.trace(model, torch.randn(B, SQ, D))
        guarded(torch.randn(B, SQ, D))
    assert [f.kind for f in inner.findings] == ["softmax_axis"]
    assert [f.kind for f in shapeguard.last_trace(guarded).findings] == ["softmax_axis"]
    # The outer trace saw neither forward's ops, but received both findings.
    assert [e.op for e in outer.events] == ["randn", "randn"]
    assert [f.kind for f in outer.findings] == ["softmax_axis", "softmax_axis"]


class _Counting(torch.overrides.TorchFunctionMode):
    """A mode of the user's own, counting the calls torch hands it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.no_shapeguard  # inspects the mode stack itself
def test_a_trace_inside_a_background_one_runs_without_the_background_mode_below_it():
    # The background trace (the pytest plugin's) steps aside for a trace opened inside
    # it: a mode per session, left below, was called again for every op of the inner trace
    # and every tensor attribute the inner trace's own code read. There is one mode per
    # thread, whichever sessions are open, also when the inner block raises; a mode of the
    # user's pushed above it stays where it is.
    depth = torch._C._len_torch_function_stack
    outer = shapeguard.Trace(background=True)
    with outer:
        assert depth() == 1
        with shapeguard.trace() as inner:
            assert depth() == 1  # the inner mode alone
            torch.randn(B, SQ, D).softmax(-1)
        assert depth() == 1 and len(inner.events) == 2
        with pytest.raises(ZeroDivisionError), shapeguard.trace():
            torch.randn(B, SQ, D).softmax(-1)
            raise ZeroDivisionError
        assert depth() == 1
        torch.randn(B, SQ)  # the background trace records again
        counting = _Counting()
        with counting:
            with shapeguard.trace() as under_user_mode:
                assert depth() == 2  # no second mode: the thread's one, below the user's
                torch.randn(B, SQ, D).softmax(-1)
            assert depth() == 2
            assert torch._C._get_function_stack_at(1) is counting
    assert depth() == 0
    assert [e.op for e in outer.events] == ["randn"]
    assert len(under_user_mode.events) == 2 and counting.calls >= 2


def test_disable_stops_an_open_trace():
    with shapeguard.trace() as trace:
        shapeguard.disable()
        try:
            torch.randn(B, SQ) @ torch.randn(SQ, SK)
        finally:
            shapeguard.enable()
    assert trace.events == []


def test_stacked_self_attention_layers_stay_silent():
    # The second layer's input comes out of the first named [batch, seq_q, d_model];
    # its scores are still [seq_q, seq_k], and softmax over them is right.
    stack = nn.Sequential(HandAttention(), HandAttention(), HandAttention())
    trace = shapeguard.trace(stack, torch.randn(B, SQ, D))
    assert trace.findings == []
    assert [r.axes[-2:] for r in trace.records("scores")][-1] == ("seq_q", "seq_k")


# -- the guard's forward: a wrapper in the instance's dict, not module hooks ---------------
@pytest.mark.no_shapeguard
def test_a_deep_copy_of_a_guarded_module_runs_its_own_weights():
    import copy

    model = shapeguard.guard(HandAttention())
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.W_q.weight.add_(1.0)
        x = torch.randn(B, SQ, D)
        assert not torch.equal(twin(x), model(x))
        assert torch.equal(twin(x), shapeguard.unguard(copy.deepcopy(twin))(x))


def test_a_pickled_guarded_module_loads_and_runs():
    import pickle

    model = shapeguard.guard(HandAttention())
    loaded = pickle.loads(pickle.dumps(model))
    x = torch.randn(B, SQ, D)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_the_guarded_forward_keeps_the_signature_of_the_classs():
    import inspect

    model = HandAttention()
    before = inspect.signature(model.forward)
    shapeguard.guard(model)
    assert inspect.signature(model.forward) == before  # what transformers reads of forward
    shapeguard.unguard(model)
    assert "forward" not in model.__dict__


@pytest.mark.no_shapeguard
def test_a_forward_replaced_on_the_class_after_guarding_is_the_one_that_runs(monkeypatch):
    model = shapeguard.guard(HandAttention())
    monkeypatch.setattr(HandAttention, "forward", lambda self, x: x * 2)
    x = torch.randn(B, SQ, D)
    assert torch.equal(model(x), x * 2)


class _Contracted(nn.Module):
    def forward(self, x: Float[torch.Tensor, "batch seq d"]) -> Float[torch.Tensor, "batch seq d"]:
        return x * 2


@pytest.mark.no_shapeguard
def test_a_check_that_raises_before_forward_leaves_no_call_behind():
    """The contract check runs inside the wrapper's try, as torch runs an always_call hook
    when a pre-hook raises: the guard's call record is popped."""
    from shapeguard._contract import call as _call

    model = shapeguard.guard(_Contracted())
    with pytest.raises(shapeguard.ShapeError):
        model(torch.randn(B, SQ))  # 2-D where the contract wants [batch, seq, d]
    assert not getattr(_call._local, "stack", None)
    assert torch.equal(model(torch.ones(B, SQ, D)), torch.full((B, SQ, D), 2.0))


def _dropped_guarded_class(options: dict, use: str):
    decorate = shapeguard.guard(**options) if options else shapeguard.guard

    @decorate
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).softmax(-1)

    model = Tiny()
    for _ in range(3):  # the third forward replays the second's recording
        model(torch.randn(2, 4))
    if use == "last_trace":
        assert shapeguard.last_trace(model) is not None
    elif use == "inside a trace":
        with shapeguard.trace():
            model(torch.randn(2, 4))
    elif use == "trace(model)":
        shapeguard.trace(model, torch.randn(2, 4))
    return weakref.ref(Tiny), weakref.ref(model)


@pytest.mark.parametrize("options", [{}, {"check": "first"}], ids=["every", "first"])
@pytest.mark.parametrize("use", ["forward", "last_trace", "inside a trace", "trace(model)"])
def test_a_dropped_guarded_class_and_its_instances_are_collected(options, use):
    # Nothing shapeguard keeps (the forward wrappers, replay recordings, last traces,
    # signature caches) holds a guarded class or its instances once the user drops them.
    cls, model = _dropped_guarded_class(options, use)
    gc.collect()
    assert model() is None, "a guarded instance outlived its last reference"
    assert cls() is None, "a guarded class outlived its last reference"


def test_a_block_keeps_no_model_it_ran_and_names_the_next_ones_modules():
    x = torch.randn(2, 4)
    with shapeguard.trace() as trace:
        first = nn.Sequential(nn.Linear(4, 4))
        first(x)
        dropped = weakref.ref(first)
        del first
        gc.collect()
        assert dropped() is None, "the block's session kept the first model it ran"
        second = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        second(x)
    # The ops inside modules (building the models inside the block records their inits).
    assert [(e.op, e.module, e.module_type) for e in trace.events if e.module_type] == [
        ("linear", "0", "Linear"),
        ("linear", "0", "Linear"),
        ("relu", "1", "ReLU"),
    ]
