"""torch's composite modules keep their fast paths under shapeguard, and are still checked.

nn.MultiheadAttention and the nn.Transformer* modules take fused kernels in eval +
no_grad (and nn.TransformerEncoder its nested-tensor path, which leaves padded
positions at 0) only when no TorchFunctionMode is active. shapeguard checks them at
the module boundary and runs them with its modes off torch's stack, so outputs are
bit-identical to plain torch. Sizes: batch 3, seq 7 (memory 6), d_model 64, heads 4,
except where the existing checks' tests use their own.

Outputs "plain" are computed with no shapeguard anywhere, so this module opts out of
the suite's own pytest plugin (one test opts back in to check the plugin's path).
"""

import warnings

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import shapeguard
from shapeguard import ShapeError, ShapeWarning

pytestmark = [
    pytest.mark.no_shapeguard,
    # torch's own note on its nested-tensor path (plain torch gives it too).
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
]

B, S, SM, D, H, FF = 3, 7, 6, 64, 4, 96


def _stack() -> int:
    return torch._C._len_torch_function_stack()


def _global_hooks() -> tuple[int, ...]:
    hooks = torch.nn.modules.module
    return (
        len(hooks._global_forward_pre_hooks),
        len(hooks._global_forward_hooks),
        len(hooks._global_forward_hooks_always_called),
    )


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(B, S, D)
    memory = torch.randn(B, SM, D)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -3:] = True  # True = padding; example 0 has 4 real tokens
    memory_pad = torch.zeros(B, SM, dtype=torch.bool)
    memory_pad[1, -2:] = True
    return x, memory, pad, memory_pad


def _cases():
    x, memory, pad, memory_pad = _inputs()
    causal = nn.Transformer.generate_square_subsequent_mask(S)
    seq_first = x.transpose(0, 1)
    return [
        (
            "mha_batch_first",
            lambda: nn.MultiheadAttention(D, H, batch_first=True),
            (x, x, x),
            {"need_weights": False},
        ),
        (
            "mha_batch_first_padding_weights",
            lambda: nn.MultiheadAttention(D, H, batch_first=True),
            (x, x, x),
            {"key_padding_mask": pad, "need_weights": True},
        ),
        (
            "mha_batch_first_causal",
            lambda: nn.MultiheadAttention(D, H, batch_first=True),
            (x, x, x),
            {"attn_mask": causal, "need_weights": False},
        ),
        (
            "mha_seq_first_padding",
            lambda: nn.MultiheadAttention(D, H),
            (seq_first, seq_first, seq_first),
            {"key_padding_mask": pad, "need_weights": False},
        ),
        (
            "mha_seq_first_weights",
            lambda: nn.MultiheadAttention(D, H),
            (seq_first, seq_first, seq_first),
            {},
        ),
        (
            "mha_cross",
            lambda: nn.MultiheadAttention(D, H, batch_first=True),
            (x, memory, memory),
            {"key_padding_mask": memory_pad},
        ),
        (
            "encoder_layer_padding",
            lambda: nn.TransformerEncoderLayer(D, H, FF, batch_first=True),
            (x,),
            {"src_key_padding_mask": pad},
        ),
        (
            "encoder_layer_norm_first_causal",
            lambda: nn.TransformerEncoderLayer(D, H, FF, batch_first=True, norm_first=True),
            (x,),
            {"src_mask": causal, "is_causal": True},
        ),
        (
            "encoder_nested_padding",
            lambda: nn.TransformerEncoder(
                nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2
            ),
            (x,),
            {"src_key_padding_mask": pad},
        ),
        (
            "decoder_layer",
            lambda: nn.TransformerDecoderLayer(D, H, FF, batch_first=True),
            (x, memory),
            {"tgt_mask": causal, "memory_key_padding_mask": memory_pad},
        ),
        (
            "decoder",
            lambda: nn.TransformerDecoder(
                nn.TransformerDecoderLayer(D, H, FF, batch_first=True), 2
            ),
            (x, memory),
            {"tgt_mask": causal},
        ),
        (
            "transformer",
            lambda: nn.Transformer(D, H, 2, 2, FF, batch_first=True),
            (memory, x),
            {"src_key_padding_mask": memory_pad, "tgt_mask": causal},
        ),
    ]


CASES = _cases()
IDS = [c[0] for c in CASES]
PARAMS = [c[1:] for c in CASES]


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def _same(actual, expected) -> None:
    actual, expected = _first(actual), _first(expected)
    assert not actual.is_nested and actual.shape == expected.shape
    assert torch.equal(actual, expected), (actual - expected).abs().max().item()


class User(nn.Module):
    """A user's module around a composite: its own ops are traced, the composite's not."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.scale = nn.Linear(D, D)

    def forward(self, *args, **kwargs):
        return _first(self.inner(*args, **kwargs)) * 2.0


def _plain(model, args, kwargs):
    assert _stack() == 0
    with torch.no_grad():
        return model(*args, **kwargs)


@pytest.mark.parametrize(("build", "args", "kwargs"), PARAMS, ids=IDS)
def test_outputs_are_bit_identical_in_eval_under_a_trace(build, args, kwargs):
    torch.manual_seed(0)
    model = build().eval()
    expected = _plain(model, args, kwargs)
    with torch.no_grad(), shapeguard.trace() as trace:
        actual = model(*args, **kwargs)
        assert _stack() == 1  # the trace's mode is back after the composite
    assert _stack() == 0
    _same(actual, expected)
    assert trace.findings == []
    # One event for the whole composite, in the caller's layout.
    (event,) = trace.events
    assert event.op == (
        "multi_head_attention_forward"
        if isinstance(model, nn.MultiheadAttention)
        else type(model).__name__
    )
    assert event.inputs[0].shape == tuple(args[0].shape)
    assert event.outputs[0].shape == tuple(_first(expected).shape)


@pytest.mark.parametrize(("build", "args", "kwargs"), PARAMS, ids=IDS)
def test_outputs_are_bit_identical_in_eval_when_guarded(build, args, kwargs):
    torch.manual_seed(0)
    model = build().eval()
    expected = _plain(model, args, kwargs)
    before = _global_hooks()
    shapeguard.guard(model)
    try:
        if isinstance(model, nn.TransformerEncoderLayer):  # a hook would turn its fast path off
            assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
        with torch.no_grad():
            actual = model(*args, **kwargs)
        assert _stack() == 0
        trace = shapeguard.last_trace(model)
        assert [e.op for e in trace.events] and trace.findings == []
    finally:
        shapeguard.unguard(model)
    assert _global_hooks() == before
    _same(actual, expected)


@pytest.mark.parametrize(("build", "args", "kwargs"), PARAMS, ids=IDS)
def test_outputs_are_bit_identical_inside_a_traced_user_module(build, args, kwargs):
    torch.manual_seed(0)
    model = User(build()).eval()
    expected = _plain(model, args, kwargs)
    with torch.no_grad(), warnings.catch_warnings():
        # The seq-first cases get mha_batch_first: the root's inputs read as [batch, seq, d].
        warnings.simplefilter("ignore", ShapeWarning)
        with shapeguard.trace(mode="warn") as trace:
            actual = model(*args, **kwargs)
        shapeguard.guard(model)  # hooks on the user's module, none on the composite
        try:
            guarded = model(*args, **kwargs)
        finally:
            shapeguard.unguard(model)
    _same(actual, expected)
    _same(guarded, expected)
    assert [f.kind for f in trace.findings] in ([], ["mha_batch_first"])
    assert [e.module for e in trace.events][:1] == ["inner"]
    assert trace.events[-1].op == "mul"  # the user's own op after it is traced


def test_nested_tensor_path_keeps_padded_positions_at_zero():
    x, _, pad, _ = _inputs()
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)
    encoder.eval()
    expected = _plain(encoder, (x,), {"src_key_padding_mask": pad})
    assert expected[0, -3:].abs().sum() == 0  # plain torch: the nested-tensor path
    with torch.no_grad():
        with shapeguard.trace():
            traced = encoder(x, src_key_padding_mask=pad)
        model = shapeguard.trace(encoder, x, src_key_padding_mask=pad)
    assert traced[0, -3:].abs().sum() == 0
    assert torch.equal(traced, expected)
    assert [e.op for e in model.events] == ["TransformerEncoder"]


def test_train_mode_is_bit_identical_with_the_same_seed():
    x, memory, _, _ = _inputs()
    causal = nn.Transformer.generate_square_subsequent_mask(S)
    model = nn.Transformer(D, H, 1, 1, FF, dropout=0.25, batch_first=True)
    torch.manual_seed(7)
    expected = model(memory, x, tgt_mask=causal)
    torch.manual_seed(7)
    with shapeguard.trace() as trace:
        actual = model(memory, x, tgt_mask=causal)
    assert torch.equal(actual, expected)
    assert model.training and actual.requires_grad
    actual.sum().backward()  # the graph is torch's own
    assert [e.op for e in trace.events] == ["Transformer"]


def test_pytest_plugin_background_trace_keeps_fast_paths():
    x, _, pad, _ = _inputs()
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)
    encoder.eval()
    expected = _plain(encoder, (x,), {"src_key_padding_mask": pad})
    background = shapeguard.Trace(background=True)  # what the plugin opens around a test
    with torch.no_grad(), background:
        actual = encoder(x, src_key_padding_mask=pad)
        with shapeguard.trace() as inner:  # a trace inside it takes both modes off
            nested = encoder(x, src_key_padding_mask=pad)
        assert _stack() == 1
        guarded = shapeguard.guard(nn.TransformerEncoderLayer(D, H, FF, batch_first=True).eval())
        layer_plain = guarded(x, src_key_padding_mask=pad)
        shapeguard.unguard(guarded)
    assert _stack() == 0
    _same(actual, expected)
    _same(nested, expected)
    assert [e.op for e in inner.events] == ["TransformerEncoder"]
    assert [e.op for e in background.events][:1] == ["TransformerEncoder"]
    assert layer_plain.shape == x.shape


@pytest.fixture
def plain_encoder():
    x, _, pad, _ = _inputs()
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)
    encoder.eval()
    return encoder, x, pad, _plain(encoder, (x,), {"src_key_padding_mask": pad})


@pytest.mark.shapeguard  # the suite's own plugin traces this test's body (fixtures untraced)
def test_under_the_pytest_plugin(plain_encoder):
    encoder, x, pad, expected = plain_encoder
    from shapeguard._trace.current import current_session

    assert _stack() == 1 and current_session().background
    with torch.no_grad():
        actual = encoder(x, src_key_padding_mask=pad)
    assert actual[0, -3:].abs().sum() == 0
    _same(actual, expected)


# -- the mode stack ---------------------------------------------------------------------------
class _Probe:
    """A global pre-hook (global hooks leave torch's fast paths alone) that notes the
    mode-stack depth each module's forward starts with."""

    def __init__(self):
        self.depths: dict[str, int] = {}
        self.names: dict[int, str] = {}

    def __enter__(self):
        self.handle = torch.nn.modules.module.register_module_forward_pre_hook(self.hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    def hook(self, module, args):
        self.depths.setdefault(type(module).__name__, _stack())


def test_nested_composites_are_suspended_once_and_see_no_mode():
    x, memory, _, _ = _inputs()
    model = User(nn.Transformer(D, H, 1, 1, FF, batch_first=True)).eval()
    # The probe's hook is registered after the trace's: it runs after them.
    with torch.no_grad(), shapeguard.trace() as trace, _Probe() as probe:
        model(memory, x)
    assert probe.depths["User"] == 1
    for inner in ("Transformer", "TransformerEncoder", "TransformerEncoderLayer"):
        assert probe.depths[inner] == 0, inner
    assert probe.depths["MultiheadAttention"] == 0
    assert [e.op for e in trace.events] == ["Transformer", "mul"]
    assert _stack() == 0


def test_the_mode_stack_is_restored_when_forward_raises():
    x, _, pad, _ = _inputs()
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    before = _global_hooks()
    with shapeguard.trace() as trace:
        # An int mask passes the shape checks; torch's own AssertionError comes from inside.
        with pytest.raises(AssertionError, match="only bool and floating types"):
            mha(x, x, x, key_padding_mask=pad.long())
        assert _stack() == 1
        mha(x, x, x)  # and the next call is suspended and restored again
        assert _stack() == 1
    assert _stack() == 0 and _global_hooks() == before
    assert [e.op for e in trace.events] == ["long", "multi_head_attention_forward"]


def test_the_mode_stack_is_restored_when_a_guarded_layer_raises():
    x, _, pad, _ = _inputs()
    layer = shapeguard.guard(nn.TransformerEncoderLayer(D, H, FF, batch_first=True))
    before = _global_hooks()
    for _ in range(2):
        with pytest.raises(AssertionError, match="only bool and floating types"):
            layer(x, src_key_padding_mask=pad.long())
        with pytest.raises(ShapeError):  # the boundary check raises in the pre-hook
            layer(torch.randn(B, S, D + 1))
        assert _stack() == 0 and _global_hooks() == before
    from shapeguard._trace.current import current_session

    assert current_session() is None
    shapeguard.unguard(layer)
    assert _global_hooks() == (0, 0, 0)


def test_the_mode_stack_is_restored_after_an_interrupt_inside_the_composite():
    """torch runs no always_call hook for a BaseException: closing the trace restores it."""
    x, _, _, _ = _inputs()
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)

    def interrupt(module, args):
        raise KeyboardInterrupt

    handle = encoder.layers[1].register_forward_pre_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), shapeguard.trace():
            encoder(x)
    finally:
        handle.remove()
    assert _stack() == 0
    assert _global_hooks() == (0, 0, 0)


class _Noop(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_another_mode_on_top_keeps_the_slow_path_and_its_checks():
    x, _, _, _ = _inputs()
    mha = nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():
        with _Noop():
            expected = mha(x, x, x)
        with shapeguard.trace() as trace, _Noop():
            actual = mha(x, x, x)
            assert _stack() == 2
    _same(actual, expected)
    # shapeguard sees torch's own functional call, as before.
    assert "multi_head_attention_forward" in [e.op for e in trace.events]
    assert [e.op for e in trace.events] != ["multi_head_attention_forward"]


def test_user_subclasses_and_user_code_inside_stay_visible():
    class MyAttention(nn.MultiheadAttention):
        pass

    def my_gelu(x):
        return torch.nn.functional.gelu(x) * 1.0

    x, _, _, _ = _inputs()
    with torch.no_grad():
        sub = shapeguard.trace(MyAttention(D, H, batch_first=True).eval(), x, x, x)
        layer = nn.TransformerEncoderLayer(D, H, FF, activation=my_gelu, batch_first=True)
        custom = shapeguard.trace(layer.eval(), x)
        wrapped = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(D, H, FF), 1, enable_nested_tensor=False
        )
        wrapped.norm = User(nn.Identity())  # a user module inside the encoder
        inner = shapeguard.trace(wrapped, x.transpose(0, 1))
    assert "transpose" in [e.op for e in sub.events]  # MultiheadAttention.forward's own ops
    assert "mul" in [e.op for e in custom.events]  # my_gelu's
    ops = [e.op for e in inner.events]
    assert "TransformerEncoder" not in ops and "TransformerEncoderLayer" in ops and "mul" in ops


def test_guarded_encoder_layer_has_no_hook_of_its_own():
    layer = nn.TransformerEncoderLayer(D, H, FF, batch_first=True)
    shapeguard.guard(layer)
    assert shapeguard.is_guarded(layer)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in layer.modules())
    shapeguard.unguard(layer)
    assert not shapeguard.is_guarded(layer) and _global_hooks() == (0, 0, 0)
    mha = shapeguard.guard(nn.MultiheadAttention(D, H))  # its own hooks leave its fast path
    assert len(mha._forward_hooks) == 1
    shapeguard.unguard(mha)


def test_trace_table_and_html_show_the_composite():
    x, _, pad, _ = _inputs()
    model = User(
        nn.TransformerEncoder(nn.TransformerEncoderLayer(D, H, FF, batch_first=True), 2)
    ).eval()
    with torch.no_grad():
        trace = shapeguard.trace(model, x, src_key_padding_mask=pad)
    row = trace.table(width=200).splitlines()[4]
    assert "│ inner  │ TransformerEncoder │" in row and "[batch=3, seq=7, 64]" in row
    assert "nn.TransformerEncoder" in trace.to_html()


# -- the boundary checks -----------------------------------------------------------------------
# The messages of checks/mha.py and checks/layout.py, as tests/test_checks.py and
# tests/test_silent_bugs.py pin them for the functional call (batch 2, heads 3, seq 5, d 33).
SB, SS, SK, SD, SH = 2, 5, 7, 33, 3


class Block(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, *args, **kwargs):
        return self.layer(x, *args, **kwargs)


def _error(run) -> ShapeError:
    with pytest.raises(ShapeError) as info:
        run()
    return info.value


def _lines(error) -> list[str]:
    return str(error).splitlines()


def test_wrong_embed_dim_is_caught_at_the_boundary():
    x = torch.randn(SB, SS, SD + 1)
    mha = nn.MultiheadAttention(SD, SH, batch_first=True)
    error = _error(lambda: shapeguard.trace(mha, x, x, x))
    assert error.kind == "mha_embed"
    lines = _lines(error)
    assert lines[0] == "MultiheadAttention: query.embed_dim (34) != embed_dim (33)"
    assert lines[1].startswith("  in  MultiheadAttention at ") and "test_composites.py:" in lines[1]
    assert lines[2] == "      error = _error(lambda: shapeguard.trace(mha, x, x, x))"
    assert lines[3:] == [
        "  query  [batch=2, seq_q=5, embed_dim=34]",
        "  key    [batch=2, seq_k=5, embed_dim=34]",
        "  value  [batch=2, seq_k=5, embed_dim=34]",
        "  hint: the module was built with embed_dim=33; project the input to 33 features or "
        "build MultiheadAttention(34, num_heads)",
    ]
    layer = shapeguard.guard(nn.TransformerEncoderLayer(SD, SH, 20, batch_first=True))
    error = _error(lambda: layer(x))
    assert error.kind == "mha_embed" and error.module == "self_attn (MultiheadAttention)"
    assert _lines(error)[0] == "MultiheadAttention: query.embed_dim (34) != embed_dim (33)"
    shapeguard.unguard(layer)


def test_transposed_key_padding_mask_is_caught():
    x = torch.randn(SS, SB, SD)  # [seq, batch, d]: batch_first=False
    error = _error(
        lambda: shapeguard.trace(
            nn.MultiheadAttention(SD, SH), x, x, x, key_padding_mask=torch.zeros(SS, SB).bool()
        )
    )
    assert error.kind == "mha_key_padding_mask"
    assert _lines(error)[0] == (
        "MultiheadAttention (batch_first=False): key_padding_mask [5, 2] != [batch=2, seq_k=5]"
    )
    assert error.hint.startswith("key_padding_mask is [5, 2], the transpose of [batch=2, seq_k=5]")
    # As tests/test_checks.py's functional case: the [batch, seq] input read seq-first.
    error = _error(
        lambda: shapeguard.trace(
            nn.MultiheadAttention(SD, SH),
            torch.randn(SB, SS, SD),
            torch.randn(SB, SS, SD),
            torch.randn(SB, SS, SD),
            key_padding_mask=torch.zeros(SB, SS, dtype=torch.bool),
        )
    )
    assert _lines(error)[0] == (
        "MultiheadAttention (batch_first=False): key_padding_mask [2, 5] != [batch=5, seq_k=2]"
    )
    assert "build MultiheadAttention(..., batch_first=True)" in error.hint
    # In an encoder layer, under the layer's own batch_first.
    block = Block(nn.TransformerEncoderLayer(SD, SH, 20, batch_first=True))
    x = torch.randn(SB, SS, SD)
    error = _error(
        lambda: shapeguard.trace(block, x, src_key_padding_mask=torch.zeros(SS, SB).bool())
    )
    assert error.kind == "mha_key_padding_mask"
    assert _lines(error)[0] == (
        "MultiheadAttention (batch_first=True): key_padding_mask [5, 2] != [batch=2, seq_k=5]"
    )
    assert _lines(error)[1].startswith("  in  layer.self_attn (MultiheadAttention) at ")
    assert _lines(error)[2] == "      return self.layer(x, *args, **kwargs)"
    assert _lines(error)[3:] == [
        "  query             [batch=2, seq_q=5, embed_dim=33]",
        "  key               [batch=2, seq_k=5, embed_dim=33]",
        "  value             [batch=2, seq_k=5, embed_dim=33]",
        "  key_padding_mask  [5, 2]",
        "  hint: key_padding_mask is [5, 2], the transpose of [batch=2, seq_k=5]. with "
        "batch_first=True pass [batch, seq, embed_dim]; were the inputs [seq, batch, embed_dim]?",
    ]


def test_memory_key_padding_mask_of_the_wrong_length_is_caught_in_nn_transformer():
    with warnings.catch_warnings():  # torch: no nested tensors with an odd head count
        warnings.simplefilter("ignore", UserWarning)
        block = Block(nn.Transformer(SD, SH, 1, 1, 20, batch_first=True))
    src, tgt = torch.randn(SB, SK, SD), torch.randn(SB, SS, SD)
    error = _error(
        lambda: shapeguard.trace(
            block, src, tgt, memory_key_padding_mask=torch.zeros(SB, SS, dtype=torch.bool)
        )
    )
    assert error.kind == "mha_key_padding_mask"
    assert _lines(error)[0] == (
        "MultiheadAttention (batch_first=True): key_padding_mask [2, 5] != [batch=2, seq_k=7]"
    )
    assert error.module == "layer.decoder.layers.0.multihead_attn (MultiheadAttention)"


class PositionedBlock(nn.Module):
    """Learned positions added along axis 1 (the sequence of a batch-first input), then
    the layer: the positions are the witness of the input's layout."""

    def __init__(self, layer):
        super().__init__()
        self.pos = nn.Embedding(16, SD)
        self.layer = layer

    def forward(self, x, *args, **kwargs):
        x = x + self.pos(torch.arange(x.shape[1]))
        return self.layer(x, *args, **kwargs)


def test_batch_first_forgotten_in_a_user_module_is_caught():
    block = PositionedBlock(nn.TransformerEncoderLayer(SD, SH, 20))  # batch_first=False
    x = torch.randn(SB, SS, SD)  # [batch, seq, d_model]
    with pytest.warns(ShapeWarning) as record:
        trace = shapeguard.trace(block, x, mode="warn")
    (finding,) = trace.findings
    assert finding.kind == "mha_batch_first"
    lines = str(record[0].message).splitlines()
    assert lines[0] == (
        "MultiheadAttention(batch_first=False) got x [batch=2, seq=5, embed_dim=33]: it reads "
        "[seq, batch, embed_dim], so it attends across the 2 examples of the batch, once per token"
    )
    assert lines[1].startswith("  in  layer.self_attn (MultiheadAttention) at ")
    assert lines[2:] == [
        "      return self.layer(x, *args, **kwargs)",
        "  x      [batch=2, seq=5, 33] float32",
        "  hint: build nn.MultiheadAttention(..., batch_first=True), or pass x.transpose(0, 1) "
        "(and the same for key and value) and transpose the output back",
    ]
    fixed = PositionedBlock(nn.TransformerEncoderLayer(SD, SH, 20, batch_first=True))
    assert shapeguard.trace(fixed, x).findings == []


def test_a_seq_first_input_to_a_seq_first_layer_is_no_finding():
    """Without a witness, [seq, batch, d_model] into batch_first=False (correct, legacy
    seq-first code) and [batch, seq, d_model] into it (the bug) are the same computation:
    the input's usual batch-first layout alone must not call the correct one a bug."""
    block = Block(nn.TransformerEncoderLayer(SD, SH, 20))
    assert shapeguard.trace(block, torch.randn(SS, SB, SD)).findings == []


def test_mask_semantics_still_read_the_composite_masks():
    x = torch.randn(SB, SS, SD)
    real = torch.arange(SS)[None, :] < torch.tensor([5, 3])[:, None]  # True = real token
    with pytest.warns(ShapeWarning):
        trace = shapeguard.trace(
            Block(nn.TransformerEncoderLayer(SD, SH, 20, batch_first=True)),
            x,
            src_key_padding_mask=real,
            mode="warn",
        )
    (finding,) = trace.findings
    assert finding.kind == "mask_polarity"
    assert finding.message.splitlines()[0] == (
        "MultiheadAttention: key_padding_mask hides every key of 1 example(s) and keeps the "
        "padding of the others: its True marks the real tokens"
    )
