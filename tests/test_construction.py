"""Head counts inside a trace: torch's constructors, and modules as a trace first enters them.

These tests provoke violations on purpose and assert on them, so they opt out of the
suite's own pytest plugin.
"""

import inspect
import math
import re
import warnings

import pytest
import torch
from torch import nn

import shapeguard
from shapeguard import ShapeError

pytestmark = pytest.mark.no_shapeguard

B, S = 2, 7


def _next_line() -> int:
    """The number of the caller's next line (the one that raises)."""
    return inspect.currentframe().f_back.f_lineno + 1


def _lines(error: BaseException) -> list[str]:
    return str(error).splitlines()


def _where(cls: str, line: int) -> str:
    return f"  in  {cls} at tests/test_construction.py:{line}"


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    import pathlib

    monkeypatch.chdir(pathlib.Path(__file__).resolve().parent.parent)  # relative locations


# -- torch's constructors --------------------------------------------------------------------
def test_multihead_attention_built_in_a_trace_gets_head_divisibility():
    with pytest.raises(ShapeError) as info, shapeguard.trace() as trace:
        line = _next_line()
        nn.MultiheadAttention(1024, 12)
    error = info.value
    assert error.kind == "head_divisibility" and error.op == "__init__"
    assert _lines(error) == [
        "embed_dim=1024 is not divisible by num_heads=12 (1024 = 12 * 85 + 4) "
        "in MultiheadAttention(...)",
        _where("MultiheadAttention", line),
        "      nn.MultiheadAttention(1024, 12)",
        "  hint: head counts that work for embed_dim=1024: 1, 2, 4, 8, 16, 32, 64, 128, 256; "
        "or pick embed_dim as a multiple of num_heads (e.g. 1020)",
    ]
    assert type(error.__cause__) is AssertionError
    assert str(error.__cause__) == "embed_dim must be divisible by num_heads"
    assert [f.kind for f in trace.findings] == ["head_divisibility"]


def test_transformer_layers_are_named_in_their_own_arguments():
    with pytest.raises(ShapeError) as info, shapeguard.trace():
        line = _next_line()
        nn.TransformerEncoderLayer(d_model=1024, nhead=12, batch_first=True)
    assert _lines(info.value) == [
        "d_model=1024 is not divisible by nhead=12 (1024 = 12 * 85 + 4) "
        "in TransformerEncoderLayer(...)",
        _where("TransformerEncoderLayer", line),
        "      nn.TransformerEncoderLayer(d_model=1024, nhead=12, batch_first=True)",
        "  hint: head counts that work for d_model=1024: 1, 2, 4, 8, 16, 32, 64, 128, 256; "
        "or pick d_model as a multiple of nhead (e.g. 1020)",
    ]
    with pytest.raises(ShapeError) as info, shapeguard.trace():
        nn.Transformer(d_model=100, nhead=3)
    assert _lines(info.value)[0] == (
        "d_model=100 is not divisible by nhead=3 (100 = 3 * 33 + 1) in Transformer(...)"
    )


class Encoder(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)


def test_construction_inside_a_user_init_points_at_the_users_line():
    with pytest.raises(ShapeError) as info, shapeguard.trace():
        Encoder(100, 3)
    line = inspect.getsourcelines(Encoder)[1] + 3
    assert _lines(info.value)[1:3] == [
        _where("MultiheadAttention", line),
        "      self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)",
    ]


def test_other_assertion_errors_pass_through_untouched():
    with pytest.raises(AssertionError) as info, shapeguard.trace():
        raise AssertionError("embed_dim must be divisible by num_heads")  # not torch's
    assert type(info.value) is AssertionError
    with pytest.raises(AssertionError, match="^d_model % n_heads"), shapeguard.trace():
        assert 512 % 6 == 0, "d_model % n_heads"
    # Outside a trace, and with shapeguard off, torch's own error as it is.
    with pytest.raises(AssertionError, match="^embed_dim must be divisible by num_heads$"):
        nn.MultiheadAttention(1024, 12)
    shapeguard.disable()
    try:
        with pytest.raises(AssertionError) as info, shapeguard.trace():
            nn.MultiheadAttention(1024, 12)
        assert type(info.value) is AssertionError
    finally:
        shapeguard.enable()


# -- modules as a trace first enters them ----------------------------------------------------
class MultiHeadAttention(nn.Module):
    """The tutorial's module: d_k = d_model // n_heads, no assert."""

    def __init__(self, d_model=512, n_heads=8):
        super().__init__()
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.W_q(x).view(b, s, self.n_heads, self.d_k).transpose(1, 2)
        k = self.W_k(x).view(b, s, self.n_heads, self.d_k).transpose(1, 2)
        v = self.W_v(x).view(b, s, self.n_heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, self.d_model)
        return self.W_o(context)


HINT_512_6 = (
    "  hint: head counts that work for d_model=512: 1, 2, 4, 8, 16, 32, 64, 128, 256; "
    "or pick d_model as a multiple of n_heads (e.g. 510)"
)


def test_tutorial_module_is_caught_when_first_entered_before_its_first_op():
    model, x = MultiHeadAttention(512, 6), torch.randn(B, S, 512)
    with pytest.raises(ShapeError) as info, shapeguard.trace() as trace:
        line = _next_line()
        model(x)
    assert info.value.kind == "head_divisibility" and info.value.op == "config"
    assert _lines(info.value) == [
        "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in MultiHeadAttention",
        _where("MultiHeadAttention", line),
        "      model(x)",
        HINT_512_6,
    ]
    assert trace.events == []  # before W_q ran
    assert [f.kind for f in trace.findings] == ["head_divisibility"]
    # The same with trace(model, ...), at the line that asks for it.
    with pytest.raises(ShapeError) as info:
        line = _next_line()
        shapeguard.trace(model, x)
    assert _lines(info.value)[1:3] == [
        _where("MultiHeadAttention", line),
        "      shapeguard.trace(model, x)",
    ]


class Block(nn.Module):
    def __init__(self, attn):
        super().__init__()
        self.norm = nn.LayerNorm(attn.d_model)
        self.attn = attn

    def forward(self, x):
        return x + self.attn(self.norm(x))


def test_a_child_module_is_named_by_its_path_at_its_call():
    model, x = Block(MultiHeadAttention(512, 6)), torch.randn(B, S, 512)
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(model, x)
    line = inspect.getsourcelines(Block.forward)[1] + 1
    assert _lines(info.value) == [
        "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in attn (MultiHeadAttention)",
        _where("attn (MultiHeadAttention)", line),
        "      return x + self.attn(self.norm(x))",
        HINT_512_6,
    ]


def test_warn_mode_warns_at_entry_and_the_trace_goes_on():
    model, x = MultiHeadAttention(512, 6), torch.randn(B, S, 512)
    with pytest.warns(shapeguard.ShapeWarning) as record, pytest.raises(ShapeError):
        shapeguard.trace(model, x, mode="warn")
    assert str(record[0].message).splitlines()[0] == (
        "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2) in MultiHeadAttention"
    )


class GroupedQuery(nn.Module):
    def __init__(self, hidden_size=66, num_heads=6, num_key_value_heads=4):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.num_key_value_heads = num_key_value_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        return self.q_proj(x)


def test_gqa_counts_are_checked_at_entry():
    with pytest.raises(ShapeError) as info:
        shapeguard.trace(GroupedQuery(), torch.randn(B, S, 66))
    assert info.value.kind == "gqa_divisibility"
    assert _lines(info.value)[0] == (
        "num_heads=6 is not divisible by num_key_value_heads=4 in GroupedQuery: grouped-query "
        "attention shares each kv head among a whole number of query heads"
    )
    assert _lines(info.value)[-1] == "  hint: kv head counts that work for num_heads=6: 1, 2, 3, 6"


# -- no false alarm ----------------------------------------------------------------------------
class HFStyleAttention(nn.Module):
    """hidden_size 100, 3 heads of head_dim 33: legal, q_proj makes 99 features."""

    def __init__(self, hidden_size=100, num_heads=3, head_dim=33):
        super().__init__()
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim)
        self.k_proj = nn.Linear(hidden_size, num_heads * head_dim)
        self.v_proj = nn.Linear(hidden_size, num_heads * head_dim)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (
            p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        context = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o_proj(context.transpose(1, 2).reshape(b, s, -1))


class WideMLP(nn.Module):
    """Declares d_model and heads (for logging, say) but never splits into heads."""

    def __init__(self, d_model=100, n_heads=3):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.down(self.up(x).relu())


@pytest.mark.parametrize("model", [HFStyleAttention(), WideMLP()], ids=["hf_style", "mlp"])
def test_modules_that_never_split_d_model_into_heads_are_silent(model):
    trace = shapeguard.trace(model, torch.randn(B, S, 100))
    assert trace.findings == [] and trace.events


def _transformers():
    return pytest.importorskip("transformers", reason="transformers is not installed (test extra)")


def test_transformers_model_with_its_own_head_dim_is_silent():
    transformers = _transformers()
    # hidden 100, 3 heads of head_dim 32 (an even rotary dim), one kv head; MLP 2 * hidden.
    config = transformers.MistralConfig(
        hidden_size=100,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=200,
        num_hidden_layers=2,
        vocab_size=50,
    )
    ids = torch.randint(0, 50, (B, S))
    torch.manual_seed(0)
    with shapeguard.trace() as built_inside:
        model = transformers.MistralForCausalLM(config).eval()
        model(ids)
    assert built_inside.findings == []
    assert shapeguard.trace(model, ids).findings == []


def test_transformers_bert_is_silent():
    transformers = _transformers()
    config = transformers.BertConfig(
        hidden_size=96,
        num_attention_heads=3,
        intermediate_size=200,
        num_hidden_layers=2,
        vocab_size=50,
    )
    torch.manual_seed(0)
    with shapeguard.trace() as trace:
        model = transformers.BertModel(config).eval()
        model(torch.randint(0, 50, (B, S)))
    assert trace.findings == []


# -- guarded constructors: the guard's mode, strictness and suppression comments ---------------
MESSAGE_512_6 = "d_model=512 is not divisible by n_heads=6 (512 = 6 * 85 + 2)"


def _guarded(**options):
    @shapeguard.guard(**options)
    class GuardedMHA(MultiHeadAttention):
        pass

    return GuardedMHA


def test_a_guarded_constructor_raises_in_raise_mode():
    guarded = _guarded()
    with pytest.raises(ShapeError) as info:
        line = _next_line()
        guarded(512, 6)
    assert info.value.kind == "head_divisibility" and info.value.op == "__init__"
    assert _lines(info.value) == [
        f"{MESSAGE_512_6} in GuardedMHA(...)",
        _where("GuardedMHA", line),
        "      guarded(512, 6)",
        HINT_512_6,
    ]


def test_a_guarded_constructor_warns_in_warn_mode_and_builds_the_module():
    guarded = _guarded(mode="warn")
    x = torch.randn(B, S, 510)
    with pytest.warns(shapeguard.ShapeWarning) as record:
        line = _next_line()
        module = guarded(512, 6)
    # Once: the arguments' check and the attributes' check after __init__ find one bug.
    assert len(record) == 1
    assert record[0].lineno == line
    assert _lines(record[0].message) == [
        f"{MESSAGE_512_6} in GuardedMHA(...)",
        _where("GuardedMHA", line),
        "      module = guarded(512, 6)",
        HINT_512_6,
    ]
    assert (module.d_model, module.n_heads, module.d_k) == (512, 6, 85)
    assert shapeguard.is_guarded(module)
    assert guarded(510, 6)(x).shape == (B, S, 510)  # a right one is silent and runs


def test_guarding_an_instance_warns_in_warn_mode_and_guards_it():
    module = MultiHeadAttention(512, 6)
    with pytest.warns(shapeguard.ShapeWarning) as record:
        shapeguard.guard(module, mode="warn")
    assert [_lines(r.message)[0] for r in record] == [f"{MESSAGE_512_6} in MultiHeadAttention"]
    assert shapeguard.is_guarded(module)


def test_a_guarded_constructors_finding_is_recorded_in_the_open_trace():
    guarded = _guarded(mode="warn")
    with pytest.warns(shapeguard.ShapeWarning), shapeguard.trace(mode="warn") as trace:
        guarded(512, 6)
    assert [(f.kind, f.message.splitlines()[0]) for f in trace.findings] == [
        ("head_divisibility", f"{MESSAGE_512_6} in GuardedMHA(...)")
    ]


def test_a_suppression_comment_on_the_constructors_line_silences_it():
    guarded = _guarded()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either
        with shapeguard.trace() as trace:
            module = guarded(512, 6)  # shapeguard: ignore[head_divisibility]
        shapeguard.guard(MultiHeadAttention(512, 6))  # shapeguard: ignore[head_divisibility]
    assert module.d_k == 85 and shapeguard.is_guarded(module)
    assert trace.findings == []
    assert [(f.kind, f.message.splitlines()[0]) for f in trace.suppressed] == [
        ("head_divisibility", f"{MESSAGE_512_6} in GuardedMHA(...)")
    ]


def test_a_suppression_comment_for_another_kind_does_not_silence_it():
    guarded = _guarded()
    with pytest.raises(ShapeError, match=f"^{re.escape(MESSAGE_512_6)} in GuardedMHA"):
        guarded(512, 6)  # shapeguard: ignore[softmax_axis]
    with pytest.warns(shapeguard.ShapeWarning, match=f"^{re.escape(MESSAGE_512_6)}"):
        _guarded(mode="warn")(512, 6)  # shapeguard: ignore[softmax_axis, gqa_divisibility]


# -- torch's constructors in a trace: the trace's mode and suppression comments ---------------
def test_torch_constructor_in_a_warn_trace_warns_then_raises_its_error():
    with (
        pytest.warns(shapeguard.ShapeWarning) as record,
        pytest.raises(ShapeError) as info,
        shapeguard.trace(mode="warn") as trace,
    ):
        line = _next_line()
        nn.MultiheadAttention(1024, 12)
    first = "embed_dim=1024 is not divisible by num_heads=12 (1024 = 12 * 85 + 4)"
    assert _lines(record[0].message)[:2] == [
        f"{first} in MultiheadAttention(...)",
        _where("MultiheadAttention", line),
    ]
    assert record[0].lineno == line
    # torch could not build it: the finding is the error raised, chained from torch's.
    assert _lines(info.value)[0] == f"{first} in MultiheadAttention(...)"
    assert type(info.value.__cause__) is AssertionError
    assert [f.kind for f in trace.findings] == ["head_divisibility"]


def test_torch_constructor_with_a_suppression_comment_fails_with_torchs_own_error():
    with pytest.raises(AssertionError) as info, shapeguard.trace() as trace:
        nn.MultiheadAttention(1024, 12)  # shapeguard: ignore[head_divisibility]
    assert type(info.value) is AssertionError
    assert str(info.value) == "embed_dim must be divisible by num_heads"
    assert trace.findings == []
    assert [f.kind for f in trace.suppressed] == ["head_divisibility"]
    with pytest.raises(ShapeError, match="^embed_dim=1024 is not divisible"), shapeguard.trace():
        nn.MultiheadAttention(1024, 12)  # shapeguard: ignore[softmax_axis]
