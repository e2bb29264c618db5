"""Shape contracts: jaxtyping annotations on forward (and on plain functions), checked on each
call, explained in the house format, line by line. Sizes are pairwise distinct: batch 2,
heads 3, seq 5, seq_k 7, d_k 11, d_model 33."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from beartype import beartype
from jaxtyping import Bool, Float, Shaped, jaxtyped
from torch import Tensor, nn

import shapeguard
from shapeguard import _source
from shapeguard._contract import call as _contract_call
from shapeguard._contract import decorator as _decorator
from shapeguard._contract.decorator import contract, contract_of
from shapeguard.contracts import GQAK, HeadsQ, Mask, Tokens

pytestmark = pytest.mark.no_shapeguard  # these tests trigger violations on purpose

B, H, S, SK, DK = 2, 3, 5, 7, 11
D = H * DK  # 33

HERE = _source.display_path(__file__)


def _line(marker: str) -> str:
    """`tests/test_contracts.py:N` of the line holding `marker` (messages name it)."""
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if marker in text and "_line(" not in text:
                return f"{HERE}:{number}"
    raise AssertionError(marker)


class Attention(nn.Module):
    """The tutorial's multi-head attention, with contracts; `bug` breaks the return value."""

    def __init__(self, d_model=D, n_heads=H, bug=None):
        super().__init__()
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.bug = bug
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Float[Tensor, "batch seq d_model"],  # contract: x
        mask: Bool[Tensor, "batch 1 seq seq"] | None = None,  # contract: mask
    ) -> Float[Tensor, "batch seq d_model"]:  # contract: return
        b = x.size(0)
        Q = self.W_q(x).view(b, -1, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_k(x).view(b, -1, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_v(x).view(b, -1, self.n_heads, self.d_k).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, -1e9)
        attn = F.softmax(scores, dim=-1)
        context = torch.matmul(attn, V).transpose(1, 2).contiguous().view(b, -1, self.d_model)
        out = self.out(context)
        if self.bug == "drop_last_feature":
            return out[..., :-1]
        return out


GuardedAttention = shapeguard.guard(type("GuardedAttention", (Attention,), {}))


def _x(seq=S, d_model=D):
    return torch.randn(B, seq, d_model)


def _causal(seq=S):
    return torch.tril(torch.ones(seq, seq, dtype=torch.bool)).expand(B, 1, seq, seq)


def _error(fn, *args, **kwargs) -> shapeguard.ShapeError:
    with pytest.raises(shapeguard.ShapeError) as info:
        fn(*args, **kwargs)
    assert info.value.kind == "contract"
    return info.value


def _lines(info) -> list[str]:
    assert info.value.kind == "contract"
    return str(info.value).splitlines()


# -- arguments, keywords, return, attributes ------------------------------------------


def test_a_correct_call_passes_and_returns_the_forward_output():
    torch.manual_seed(0)
    model = GuardedAttention()
    x, mask = _x(), _causal()
    out = model(x, mask=mask)
    shapeguard.unguard(model)
    assert torch.equal(out, model(x, mask=mask))


def test_padding_mask_for_a_4d_contract_message_line_by_line():
    model = GuardedAttention()
    with pytest.raises(shapeguard.ShapeError) as info:
        model(_x(), mask=torch.ones(B, S, dtype=torch.bool))  # call: padding
    assert _lines(info) == [
        'mask has 2 dims, its contract "batch 1 seq seq" has 4',
        f"  in  GuardedAttention at {_line('# call: padding')}",
        "      model(_x(), mask=torch.ones(B, S, dtype=torch.bool))  # call: padding",
        "  mask      [batch=2, seq=5]",
        "  expected  [batch=2, 1, seq=5, seq=5]",
        '  contract  mask: Bool[Tensor, "batch 1 seq seq"] | None, declared at '
        + _line("# contract: mask"),
        "  bound     d_model=33 (self.d_model), batch=2 (x), seq=5 (x)",
        "  hint: mask.unsqueeze(1).unsqueeze(2) makes it [batch=2, 1, 1, seq=5], which "
        'broadcasts over dim 2; to accept that, write "#seq" for dim 2 in the contract, or add '
        ".expand(-1, -1, 5, -1)",
    ]
    assert info.value.op == "forward"
    assert info.value.module == "GuardedAttention"


def test_keyword_mask_with_another_length_names_who_bound_seq():
    model = GuardedAttention()
    mask = torch.ones(B, 1, S, SK, dtype=torch.bool)
    error = _error(model, _x(), mask=mask)
    lines = str(error).splitlines()
    assert lines[0] == "mask.seq (7) != x.seq (5)"
    assert lines[3:] == [
        "  mask      [batch=2, 1, seq=5, seq=7]",
        "  expected  [batch=2, 1, seq=5, seq=5]",
        '  contract  mask: Bool[Tensor, "batch 1 seq seq"] | None, declared at '
        + _line("# contract: mask"),
        "  bound     d_model=33 (self.d_model), batch=2 (x), seq=5 (x)",
        "  hint: seq was bound to 5 by x; if mask may differ there, give that axis its own name "
        'in the contract (e.g. "seq_k")',
    ]


def test_positional_mask_is_checked_like_a_keyword_one():
    error = _error(GuardedAttention(), _x(), torch.ones(B, 1, S, SK, dtype=torch.bool))
    assert str(error).splitlines()[0] == "mask.seq (7) != x.seq (5)"


def test_an_array_of_another_class_is_named_as_such_not_read_for_its_axes():
    """A NumPy array has a shape and a dtype too; a Tensor contract says it is not one."""
    import numpy as np

    @contract
    def f(x: Float[Tensor, "n d"]) -> Float[Tensor, "n d"]:
        return x

    @contract
    def g(x: Float[np.ndarray, "n d"]) -> Float[np.ndarray, "n d"]:
        return x

    lines = str(_error(f, np.zeros((S, DK), dtype=np.float32))).splitlines()
    assert lines[0] == "x is ndarray, not a Tensor as its contract says"
    assert lines[-1] == "  hint: pass a torch.Tensor shaped [n, d]"
    lines = str(_error(g, torch.zeros(S, DK))).splitlines()
    assert lines[0] == "x is Tensor, not a ndarray as its contract says"
    assert lines[-1] == "  hint: pass a ndarray shaped [n, d]"
    assert str(_error(g, np.zeros((2, 3, 4), np.float32))).splitlines()[0] == (
        'x has 3 dims, its contract "n d" has 2'
    )


def test_wrong_dtype_says_which_and_how_to_convert():
    error = _error(GuardedAttention(), _x(), mask=_causal().float())
    lines = str(error).splitlines()
    assert lines[0] == "mask has dtype float32, its contract says Bool"
    assert lines[3] == "  mask      [batch=2, 1, seq=5, seq=5] float32"
    assert lines[-1] == (
        "  hint: convert it with mask.bool(), or use Shaped[...] in the contract to accept any dtype"
    )


def test_attribute_bound_dim_message_line_by_line():
    model = GuardedAttention()
    with pytest.raises(shapeguard.ShapeError) as info:
        model(_x(d_model=30))  # call: narrow x
    assert _lines(info) == [
        "x.d_model (30) != self.d_model (33)",
        f"  in  GuardedAttention at {_line('# call: narrow x')}",
        "      model(_x(d_model=30))  # call: narrow x",
        "  x         [batch=2, seq=5, d_model=30]",
        "  expected  [batch=2, seq=5, d_model=33]",
        '  contract  x: Float[Tensor, "batch seq d_model"], declared at ' + _line("# contract: x"),
        "  bound     d_model=33 (self.d_model), batch=2 (x dim 0), seq=5 (x dim 1)",
        "  hint: d_model is self.d_model = 33 in this module; give x 33 on dim 2, or build the "
        "module with d_model=30",
    ]


def test_return_value_is_checked_against_the_arguments_bindings():
    model = GuardedAttention(bug="drop_last_feature")
    with pytest.raises(shapeguard.ShapeError) as info:
        model(_x())  # call: return
    assert _lines(info) == [
        "output.d_model (32) != self.d_model (33)",
        f"  in  GuardedAttention at {_line('# call: return')}",
        "      model(_x())  # call: return",
        "  output    [batch=2, seq=5, d_model=32]",
        "  expected  [batch=2, seq=5, d_model=33]",
        '  contract  -> Float[Tensor, "batch seq d_model"], declared at '
        + _line("# contract: return"),
        "  bound     d_model=33 (self.d_model), batch=2 (x), seq=5 (x)",
        "  hint: d_model is 33 (self.d_model) but forward returned 32 on dim 2; look at the op "
        "that makes the return value",
    ]


class PerHead(nn.Module):
    """Dims named by canonical axes bind through the attribute spellings: heads <- n_heads,
    d_k <- d_model // n_heads."""

    def __init__(self):
        super().__init__()
        self.embed_dim = D
        self.n_heads = H

    def forward(
        self, q: Float[Tensor, "batch heads seq d_k"]
    ) -> Float[Tensor, "batch seq d_model"]:
        b, h, s, d = q.shape
        return q.transpose(1, 2).reshape(b, s, h * d)


def test_canonical_axes_bind_through_attribute_spellings():
    model = shapeguard.guard(PerHead(), ops=False)
    model(torch.randn(B, H, S, DK))
    error = _error(model, torch.randn(B, 4, S, DK))
    assert str(error).splitlines()[0] == "q.heads (4) != self.n_heads (3)"
    error = _error(model, torch.randn(B, H, S, 12))
    assert str(error).splitlines()[0] == "q.d_k (12) != self.embed_dim // self.n_heads (11)"
    assert error.hint == (
        "d_k is self.embed_dim // self.n_heads = 11 in this module; give q 11 on dim 3"
    )


def test_swapped_axes_get_a_transpose_hint():
    model = shapeguard.guard(PerHead(), ops=False)
    error = _error(model, torch.randn(B, S, H, DK))  # flash layout into a per-head contract
    assert str(error).splitlines()[0] == "q.heads (5) != self.n_heads (3)"
    assert error.hint == "q.transpose(1, 2) gives [2, 3, 5, 11]"


def test_ready_made_layouts_bind_like_hand_written_ones():
    class GQA(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads, self.n_kv_heads, self.head_dim = 6, H, DK

        def forward(self, q: HeadsQ, k: GQAK, mask: Mask | None = None) -> HeadsQ:
            return q

    model = shapeguard.guard(GQA(), ops=False)
    q, k = torch.randn(B, 6, S, DK), torch.randn(B, H, SK, DK)
    model(q, k, torch.zeros(B, 1, S, SK))  # a float (additive) mask is fine: Shaped
    error = _error(model, q, torch.randn(B, 6, SK, DK))
    assert str(error).splitlines()[0] == "k.kv_heads (6) != self.n_kv_heads (3)"
    error = _error(model, q, k, torch.zeros(B, 1, S, S))
    assert str(error).splitlines()[0] == "mask.seq_k (5) != k.seq_k (7)"


# -- plain functions: variadic, broadcast and symbolic dims --------------------------------


@contract
def scores(
    q: Float[Tensor, "*batch #heads seq_q d_k"],
    k: Float[Tensor, "*batch #heads seq_k d_k"],
) -> Float[Tensor, "*batch #heads seq_q seq_k"]:

    return q @ k.transpose(-2, -1)


@contract
def concat(a: Float[Tensor, "n d"], b: Float[Tensor, "m d"]) -> Float[Tensor, "n+m d"]:
    return torch.cat([a, b[:-1]])  # drops a row: breaks n+m


def test_variadic_and_broadcast_dims_pass_when_they_should():
    assert scores(torch.randn(B, H, S, DK), torch.randn(B, 1, SK, DK)).shape == (B, H, S, SK)
    assert scores(torch.randn(4, B, H, S, DK), torch.randn(4, B, H, SK, DK)).shape == (
        4,
        B,
        H,
        S,
        SK,
    )
    assert scores(torch.randn(H, S, DK), torch.randn(H, SK, DK)).shape == (H, S, SK)


def test_variadic_mismatch_message():
    with pytest.raises(shapeguard.ShapeError) as info:
        scores(torch.randn(B, H, S, DK), torch.randn(4, H, SK, DK))  # call: variadic
    lines = _lines(info)
    assert lines == [
        "k.*batch (4,) != q.*batch (2,)",
        f"  in  scores() at {_line('# call: variadic')}",
        "      scores(torch.randn(B, H, S, DK), torch.randn(4, H, SK, DK))  # call: variadic",
        "  k         [4, heads=3, seq_k=7, d_k=11]",
        "  expected  [*batch=(2,), #heads=3, seq_k=7, d_k=11]",
        '  contract  k: Float[Tensor, "*batch #heads seq_k d_k"], declared at '
        + _line('k: Float[Tensor, "*batch #heads seq_k d_k"]'),
        "  bound     heads=3 (q), seq_q=5 (q), d_k=11 (q), seq_k=7 (k dim 2), *batch=(2,) (q)",
        "  hint: *batch is (2,) from q; k needs the same leading axes",
    ]


def test_broadcast_dim_rejects_a_third_size():
    error = _error(scores, torch.randn(B, H, S, DK), torch.randn(B, 4, SK, DK))
    assert str(error).splitlines()[0] == "k.heads (4) != q.heads (3)"


def test_dim_arithmetic_in_the_return_value():
    error = _error(concat, torch.randn(S, DK), torch.randn(SK, DK))
    lines = str(error).splitlines()
    assert lines[0] == "output dim 0 (11) != n+m (12)"
    assert lines[3:5] == ["  output    [11, d=11]", "  expected  [n+m=12, d=11]"]
    assert error.hint == "n+m is 12 with m=7, n=5; output has 11 on dim 0"


def test_function_contract_in_warn_mode_warns_at_the_call_site():
    warn_concat = contract(concat.__wrapped__, mode="warn")
    with pytest.warns(shapeguard.ShapeWarning) as caught:
        out = warn_concat(torch.randn(S, DK), torch.randn(SK, DK))
    assert out.shape == (S + SK - 1, DK)
    assert caught[0].filename == __file__
    assert str(caught[0].message).splitlines()[0] == "output dim 0 (11) != n+m (12)"


# -- malformed annotations fail at decoration ------------------------------------------------


def test_bare_shape_string_is_a_contract_error_when_the_class_is_decorated():
    class Bare(nn.Module):
        def forward(self, x: "batch seq d_model"):  # noqa: F821
            return x

    with pytest.raises(shapeguard.ContractError) as info:
        shapeguard.guard(Bare)
    assert str(info.value) == (
        "test_bare_shape_string_is_a_contract_error_when_the_class_is_decorated.<locals>.Bare."
        "forward: the annotation of x, 'batch seq d_model', cannot be read (SyntaxError); write "
        'Float[Tensor, "batch seq d_model"] (a bare string is not a shape contract)'
    )


def test_string_annotation_jaxtyping_rejects_is_a_contract_error_at_decoration():
    # written without quotes, jaxtyping raises this while the class body runs, before
    # any decorator; as a string (or under `from __future__ import annotations`) it
    # reaches guard, which reports it at once instead of silently skipping it
    class Commas(nn.Module):
        def forward(self, x: "Float[Tensor, 'batch,seq']"):  # noqa: F821
            return x

    with pytest.raises(shapeguard.ContractError) as info:
        shapeguard.guard(Commas)
    assert str(info.value).endswith(
        "Commas.forward: the annotation of x, \"Float[Tensor, 'batch,seq']\", cannot be read "
        "(ValueError: Axes should be separated with spaces, not commas); fix the shape string"
    )


def test_broken_symbolic_dim_is_a_contract_error_at_decoration():
    class Broken(nn.Module):
        def forward(self, x: Float[Tensor, "batch seq+ d"]):
            return x

    with pytest.raises(shapeguard.ContractError, match=r'dim "seq\+" in "batch seq\+ d" is'):
        shapeguard.guard(Broken)
    with pytest.raises(shapeguard.ContractError, match="which no earlier argument binds"):

        @contract
        def f(x: Float[Tensor, "n d"]) -> Float[Tensor, "n+extra d"]:
            return x


def test_symbolic_dim_needs_an_attribute_when_the_module_is_built():
    class Grown(nn.Module):
        def __init__(self, extra=None):
            super().__init__()
            if extra is not None:
                self.extra = extra

        def forward(self, x: Float[Tensor, "batch seq d"]) -> Float[Tensor, "batch seq+extra d"]:
            return torch.cat([x, x[:, : self.extra]], dim=1)

    grown = shapeguard.guard(Grown(2), ops=False)  # extra binds to self.extra
    assert grown(torch.randn(B, S, DK)).shape == (B, S + 2, DK)
    with pytest.raises(shapeguard.ContractError) as info:
        shapeguard.guard(Grown())
    assert str(info.value) == (
        "test_symbolic_dim_needs_an_attribute_when_the_module_is_built.<locals>.Grown.forward: "
        "a symbolic dim uses extra, which no argument and no attribute of Grown binds; name it "
        "in an argument's annotation or set self.extra"
    )


def test_unguarded_instance_gets_its_contract_compiled_by_guard():
    class Later(nn.Module):
        def forward(self, x: "Float[Tensor, 'batch seq']") -> "Float[Tensor, 'batch seq']":
            return x

    model = shapeguard.guard(Later(), ops=False)  # string annotations are resolved
    error = _error(model, torch.randn(B, S, DK))
    assert str(error).splitlines()[0] == 'x has 3 dims, its contract "batch seq" has 2'


# -- modes and sampling -------------------------------------------------------------------


def test_warn_mode_warns_at_the_call_site_and_runs_forward():
    model = shapeguard.guard(Attention(), mode="warn")
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)  # broadcasts in torch; the contract wants seq
    with pytest.warns(shapeguard.ShapeWarning) as caught:
        out = model(_x(), mask=mask)  # call: warn
    assert out.shape == (B, S, D)
    [warning] = [w for w in caught if w.message.kind == "contract"]
    assert (warning.filename, warning.lineno) == (
        __file__,
        int(_line("# call: warn").split(":")[-1]),
    )
    assert str(warning.message).splitlines() == [
        "mask.seq (1) != x.seq (5)",
        f"  in  Attention at {_line('# call: warn')}",
        "      out = model(_x(), mask=mask)  # call: warn",
        "  mask      [batch=2, 1, seq=1, seq=5]",
        "  expected  [batch=2, 1, seq=5, seq=5]",
        '  contract  mask: Bool[Tensor, "batch 1 seq seq"] | None, declared at '
        + _line("# contract: mask"),
        "  bound     d_model=33 (self.d_model), batch=2 (x), seq=5 (x)",
        "  hint: seq was bound to 5 by x; if mask may differ there, give that axis its own name "
        'in the contract (e.g. "seq_k")',
    ]
    assert [f.kind for f in shapeguard.last_trace(model).findings] == ["contract"]


def test_check_first_checks_each_new_signature_once():
    model = shapeguard.guard(Attention(), check="first")
    compiled = contract_of(model)
    before = compiled.checks
    model(_x())
    model(_x())  # same shapes and dtypes: a dictionary lookup, no check
    assert compiled.checks == before + 1
    model(_x(seq=SK), mask=_causal(SK))  # new signature: checked
    assert compiled.checks == before + 2
    model(_x(seq=SK), mask=_causal(SK))
    assert compiled.checks == before + 2
    with pytest.raises(shapeguard.ShapeError):  # a new, broken signature is checked and fails
        model(_x(seq=SK), mask=_causal(S))
    with pytest.raises(shapeguard.ShapeError):  # and a failure is not cached as seen
        model(_x(seq=SK), mask=_causal(S))
    assert compiled.checks == before + 4


def test_check_every_checks_each_call():
    model = shapeguard.guard(Attention(), ops=False)
    compiled = contract_of(model)
    before = compiled.checks
    for _ in range(3):
        model(_x())
    assert compiled.checks == before + 3


def test_ops_false_checks_the_contract_without_a_trace():
    model = shapeguard.guard(Attention(), ops=False)
    model(_x())
    assert shapeguard.last_trace(model) is None
    _error(model, _x(d_model=30))


def test_bad_check_value_is_a_clear_error():
    with pytest.raises(shapeguard.ContractError, match="check='sometimes' is not supported"):
        contract(concat.__wrapped__, check="sometimes")


# -- the rest of shapeguard sees the contract's names -------------------------------------


def test_contract_names_the_axes_in_the_trace():
    class Tokens2(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(DK, DK)

        def forward(
            self, x: Float[Tensor, "batch tokens feat"]
        ) -> Float[Tensor, "batch tokens feat"]:
            return self.proj(x)

    model = shapeguard.guard(Tokens2())
    model(torch.randn(B, S, DK))
    record = shapeguard.last_trace(model).events[0].outputs[0]
    assert record.named_shape == "[batch=2, tokens=5, feat=11]"


def test_no_tensor_values_in_messages():
    x = torch.full((B, S, 30), 12345.678)
    error = _error(GuardedAttention(), x)
    assert "12345" not in str(error) and "tensor(" not in str(error)


def test_typecheck_error_of_a_stacked_jaxtyped_function_becomes_one_shape_error():
    @contract
    @jaxtyped(typechecker=beartype)
    def halve(x: Float[Tensor, "n d"]) -> Float[Tensor, "n d"]:
        return torch.full((x.shape[0], x.shape[1] // 2), 12345.678)

    error = _error(halve, torch.randn(S, DK))
    lines = str(error).splitlines()
    assert lines[0] == (
        "output breaks its contract: the size of dimension d is 5 which does not equal the "
        "existing value of 11"
    )
    assert "12345" not in str(error)
    assert error.__cause__ is None and error.__suppress_context__


def test_exception_inside_forward_leaves_no_call_state_and_no_warning():
    class Fails(nn.Module):
        def forward(self, x: Float[Tensor, "batch seq"]) -> Float[Tensor, "batch seq"]:
            raise ValueError("boom")

    model = shapeguard.guard(Fails(), check="first")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="boom"):
            model(torch.randn(B, S))
    assert _contract_call._call_stack() == []


# -- torch.compile ---------------------------------------------------------------------------


def test_contracts_step_aside_under_compile():
    torch.manual_seed(0)
    model = shapeguard.guard(Attention().eval(), ops=False)
    compiled = contract_of(model)
    x = _x()
    eager = model(x)
    before = compiled.checks
    fast = torch.compile(model, backend="eager", fullgraph=True)
    assert torch.equal(fast(x), eager)
    assert compiled.checks == before  # nothing checked while compiling or running the graph
    fn = torch.compile(scores, backend="eager", fullgraph=True)
    assert fn(torch.randn(B, H, S, DK), torch.randn(B, H, SK, DK)).shape == (B, H, S, SK)
    torch._dynamo.reset()


def test_shaped_alias_accepts_any_dtype():
    @contract
    def keep(mask: Shaped[Tensor, "batch seq_k"], x: Tokens) -> Tokens:
        return x

    keep(torch.ones(B, SK, dtype=torch.bool), torch.randn(B, S, D))
    keep(torch.zeros(B, SK), torch.randn(B, S, D))
    error = _error(keep, torch.ones(B, SK, 1, dtype=torch.bool), torch.randn(B, S, D))
    assert error.hint == "mask.squeeze(2) makes it [batch=2, seq_k=7]"


def test_core_checks_name_axes_after_the_contract():
    class NoTranspose(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k = nn.Linear(DK, D), nn.Linear(DK, D)

        def forward(
            self, x: Float[Tensor, "batch tokens feat"]
        ) -> Float[Tensor, "batch tokens tokens"]:
            Q = self.q(x)
            K = self.k(x)
            return Q @ K  # call: no transpose

    with pytest.raises(shapeguard.ShapeError) as info:
        shapeguard.guard(NoTranspose())(torch.randn(B, S, DK))
    lines = str(info.value).splitlines()
    assert info.value.kind != "contract"
    assert lines[0] == "output = Q @ K: Q.dim -1 (33) != K.tokens (5)"
    assert lines[3:5] == [
        "  Q      [batch=2, tokens=5, 33] float32",
        "  K      [batch=2, tokens=5, 33] float32",
    ]


def test_plain_type_hints_make_no_contract():
    # torch's own forwards are annotated `input: Tensor`: that is not a shape contract
    assert contract_of(shapeguard.guard(nn.Linear(DK, D))) is None
    assert contract_of(shapeguard.guard(nn.MultiheadAttention(D, H))) is None
    with pytest.raises(shapeguard.ContractError, match="has no shape annotations to check"):
        contract(lambda x: x)


def test_ready_made_layouts_use_only_the_axis_names_shapeguard_binds():
    from shapeguard import contracts as layouts

    known = {"batch", "seq", "seq_q", "seq_k", "d_model", "heads", "kv_heads", "d_k", "1"}
    assert layouts.__all__ == sorted(layouts.__all__)
    for name in layouts.__all__:
        alias = getattr(layouts, name)
        assert set(alias.dim_str.split()) <= known, name
    assert layouts.FlashQ.dim_str == "batch seq_q heads d_k"
    assert layouts.PaddingMask.dim_str == "batch seq_k"


def test_docstring_example_runs(monkeypatch):
    import doctest

    # until the façade exports it, `shapeguard.contract` is this function
    monkeypatch.setattr(shapeguard, "contract", contract, raising=False)
    result = doctest.testmod(_decorator, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0 and result.failed == 0
