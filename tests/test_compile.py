"""A guarded module under torch.compile: checked eagerly once per new input signature
while dynamo traces it, so the compiled module reports what eager reports, with no graph
break (`fullgraph=True`) and nothing of shapeguard in the graph."""

import warnings

import pytest
import torch
from attention_models import HandAttention

import shapeguard
from shapeguard import ShapeError, ShapeWarning

pytestmark = pytest.mark.no_shapeguard

B, S, D = 2, 5, 33


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(model, **options):
    return torch.compile(model, backend="eager", fullgraph=True, **options)


def _eager_findings(bug, x, mode):
    model = shapeguard.guard(HandAttention(bug=bug), mode=mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = model(x)
        except ShapeError as error:
            return None, error, []
    return out, shapeguard.last_trace(model).findings, [str(w.message) for w in caught]


def test_good_input_compiles_clean_and_matches_eager():
    torch.manual_seed(0)
    model = shapeguard.guard(HandAttention().eval())
    x = torch.randn(B, S, D)
    with torch.no_grad():
        eager = model(x)
    torch.manual_seed(0)
    fresh = shapeguard.guard(HandAttention().eval())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ShapeWarning, no warning of torch's either
        with torch.no_grad():
            compiled = _compiled(fresh)(x)
    assert torch.equal(compiled, eager)
    trace = shapeguard.last_trace(fresh)
    assert trace is not None and trace.events and trace.findings == []


def test_bad_input_raises_the_eager_error():
    x = torch.randn(B, S, D)
    _, eager, _ = _eager_findings("k_not_transposed", x, "raise")
    model = shapeguard.guard(HandAttention(bug="k_not_transposed"))
    with pytest.raises(ShapeError) as info:
        _compiled(model)(x)
    assert info.value.kind == eager.kind == "matmul_inner"
    assert str(info.value).splitlines()[0] == str(eager).splitlines()[0]
    assert type(info.value).__name__ == "ShapeError"
    # Nothing left behind by the check that raised inside dynamo's trace.
    from torch.nn.modules import module as torch_module

    assert torch._C._len_torch_function_stack() == 0
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    assert shapeguard._trace.session.current_session() is None


def test_a_silent_bug_warns_as_in_eager_and_the_output_is_unchanged():
    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    torch.manual_seed(1)
    eager_out, eager, eager_messages = _eager_findings("softmax_axis", x, "warn")
    torch.manual_seed(1)
    model = shapeguard.guard(HandAttention(bug="softmax_axis"), mode="warn")
    with pytest.warns(ShapeWarning) as caught:
        out = _compiled(model)(x)
    assert [str(w.message) for w in caught if w.category is ShapeWarning] == eager_messages
    assert [f.to_dict() for f in shapeguard.last_trace(model).findings] == [
        f.to_dict() for f in eager
    ]
    assert torch.equal(out, eager_out)


def test_checked_once_per_input_signature():
    model = shapeguard.guard(HandAttention())
    compiled = _compiled(model, dynamic=False)
    compiled(torch.randn(B, S, D))
    first = shapeguard.last_trace(model)
    compiled(torch.randn(B, S, D))  # the same signature: the compiled graph, no check
    assert shapeguard.last_trace(model) is first
    compiled(torch.randn(B, S + 2, D))  # a new one: dynamo traces again, the check runs
    assert shapeguard.last_trace(model) is not first


def test_the_check_leaves_the_rng_and_buffers_as_they_were():
    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = HandAttention()
            self.norm = torch.nn.BatchNorm1d(S)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.norm(self.attn(x)))

    x = torch.randn(B, S, D)
    torch.manual_seed(0)
    plain = Noisy().train()
    torch.manual_seed(0)
    guarded = shapeguard.guard(Noisy().train())
    torch.manual_seed(3)
    expected = _compiled(plain)(x)
    torch._dynamo.reset()
    torch.manual_seed(3)
    actual = _compiled(guarded)(x)
    assert torch.equal(actual, expected)
    assert torch.equal(guarded.norm.running_mean, plain.norm.running_mean)
    assert shapeguard.last_trace(guarded).events


def _dynamo_guards(model, x) -> list[str]:
    """The guards dynamo installs on the compiled call: what every steady-state call of
    the compiled module evaluates."""
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
    return [str(guard.name) for guard in explained.out_guards]


def test_the_compiled_call_guards_only_the_guard_s_gate():
    # A compiled guarded call pays dynamo's guards on what its traced forward read. The
    # guard's forward reads one function that dynamo does not trace (`_guard._compiling`):
    # two guards over a bare forward wrapper's, where reading the checks' own compile flags
    # in traced code cost sixteen (the runtime module, a thread-local, the hooks).
    x = torch.randn(B, S, D)
    torch.manual_seed(0)
    wrapped = HandAttention().eval()
    forward = wrapped.forward
    wrapped.forward = lambda *args, **kwargs: forward(*args, **kwargs)
    bare = _dynamo_guards(wrapped, x)
    torch.manual_seed(0)
    guarded = _dynamo_guards(shapeguard.guard(HandAttention().eval()), x)
    assert len(guarded) <= len(bare) + 4, sorted(set(guarded) - set(bare))
    read = ("G['_runtime']", "_session_local", "G['_pre_hook']", "G['_post_hook']")
    assert not [g for g in guarded if any(name in g for name in read)]
    assert any("_compiling" in g for g in guarded)
