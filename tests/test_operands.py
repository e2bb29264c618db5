"""shapeguard never changes what the user's program does, whatever the operands.

Each case runs plainly, then under `shapeguard.trace()` in warn and in raise mode and under
`shapeguard.guard(module)`, with autograd on (inputs that require grad, then `.backward()`):
the result's type, dtype, shape and bits, the gradients, and any exception must be the
plain run's. Operands that are not tensors (NumPy scalars and arrays, Python numbers,
`torch.Size`, dtypes, None) reach torch as they are; tensor subclasses stay subclasses.

A new operator is one line in `CASES` or `BINARY`, a new kind of operand one line in
`OPERANDS`. The plain run is the reference, so the module is not traced by the plugin
(`no_shapeguard`); each test traces explicitly. shapeguard's own failures are raised in this
suite (`SHAPEGUARD_INTERNAL_ERRORS=raise`, tests/conftest.py), so a swallowed bug fails here.
"""

import operator
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import shapeguard
from shapeguard import ShapeError, ShapeguardInternalWarning, _ops
from shapeguard import checks as _checks
from shapeguard._errors import InternalError
from shapeguard._trace import internal as _internal

pytestmark = pytest.mark.no_shapeguard  # the plain run must be plain


class Tagged(torch.Tensor):
    """A tensor subclass with a `__torch_function__` of its own (results stay Tagged)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


def _tagged(value: torch.Tensor) -> Tagged:
    return torch.Tensor._make_subclass(Tagged, value, True)


def _two_tensor(value: torch.Tensor):
    """A wrapper subclass (`__torch_dispatch__`), where this torch has one to test with."""
    try:
        from torch.testing._internal.two_tensor import TwoTensor
    except ImportError:
        pytest.skip("no TwoTensor in this torch")
    return TwoTensor(value, value.clone() * 2, requires_grad=True)


# The operand besides the tensor: built fresh for each run (the name says what it is).
OPERANDS: dict[str, Callable[[], object]] = {
    "np.float64": lambda: np.float64(2.0),
    "np.float32": lambda: np.float32(0.5),
    "np.int64": lambda: np.int64(3),
    "np.bool_": lambda: np.bool_(True),
    "np.array 0-d": lambda: np.array(2.0),
    "np.array 1-d float64": lambda: np.full(4, 1.5),
    "np.array 1-d int32": lambda: np.arange(1, 5, dtype=np.int32),
    "int": lambda: 3,
    "float": lambda: 2.5,
    "bool": lambda: True,
    "complex": lambda: 1 + 2j,
    "0-d tensor": lambda: torch.tensor(2.0),
    "int64 tensor": lambda: torch.arange(1, 5),
    "Parameter": lambda: nn.Parameter(torch.full((4,), 0.5)),
    "subclass with __torch_function__": lambda: _tagged(torch.full((4,), 0.5)),
    "wrapper subclass": lambda: _two_tensor(torch.full((4,), 0.5)),
}

BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}

IN_PLACE = {
    "+=": operator.iadd,
    "-=": operator.isub,
    "*=": operator.imul,
    "/=": operator.itruediv,
}


def inputs(operand: Callable[[], object] | None = None) -> dict:
    """Fresh inputs, the same values every time; `x`, `q`, `k`, `v` require grad."""
    g = torch.Generator().manual_seed(0)
    B, H, S, D = 2, 2, 5, 4  # noqa: N806
    found = {
        "x": torch.randn(2, 3, 4, generator=g, requires_grad=True),
        "mask": torch.randn(2, 3, 4, generator=g) > 0,
        "q": torch.randn(B, H, S, D, generator=g, requires_grad=True),
        "k": torch.randn(B, H, S, D, generator=g, requires_grad=True),
        "v": torch.randn(B, H, S, D, generator=g, requires_grad=True),
        "causal": torch.ones(S, S, dtype=torch.bool).triu(1),
    }
    if operand is not None:
        found["operand"] = operand()
    return found


def _scaled(x: torch.Tensor, scale) -> torch.Tensor:
    """CTRL's `inputs_embeds *= np.sqrt(d_model)`, on a copy (x is a leaf)."""
    y = x.clone()
    y *= scale
    return y


def _set(x: torch.Tensor, index, value) -> torch.Tensor:
    y = x.clone()
    y[index] = value
    return y


def _attention_np_scale(t: dict) -> torch.Tensor:
    q, k, v = t["q"], t["k"], t["v"]
    scores = q @ k.transpose(-2, -1) / np.sqrt(q.shape[-1])
    scores = scores.masked_fill(t["causal"], np.float64(-1e9))
    return F.softmax(scores, dim=-1) @ v


# Every other operator family, one line each: (name, the call on the inputs).
CASES: list[tuple[str, Callable[[dict], object]]] = [
    ("where(cond, x, np.float64)", lambda t: torch.where(t["mask"], t["x"], np.float64(0.0))),
    ("where(cond, np.float64, x)", lambda t: torch.where(t["mask"], np.float64(-1.0), t["x"])),
    ("where(cond, x, np.array 0-d)", lambda t: torch.where(t["mask"], t["x"], np.array(0.0))),
    ("x.where(cond, np.float32)", lambda t: t["x"].where(t["mask"], np.float32(0.0))),
    ("where(cond, 1.0, 0.0)", lambda t: torch.where(t["mask"], 1.0, 0.0) * t["x"]),
    ("masked_fill np.float64 -inf", lambda t: t["x"].masked_fill(t["mask"], np.float64(-np.inf))),
    ("masked_fill np.float32", lambda t: t["x"].masked_fill(~t["mask"], np.float32(-1e4))),
    ("masked_fill np.int64", lambda t: t["x"].masked_fill(t["mask"], np.int64(0))),
    ("masked_fill_ np.float64", lambda t: t["x"].clone().masked_fill_(t["mask"], np.float64(0))),
    ("x @ np.ndarray", lambda t: t["x"] @ np.ones((4, 2))),
    ("np.ndarray @ x", lambda t: np.ones((2, 3)) @ t["x"]),
    ("torch.matmul(x, np.ndarray)", lambda t: torch.matmul(t["x"], np.ones((4, 2)))),
    ("softmax(x / np.sqrt(d))", lambda t: F.softmax(t["x"] / np.sqrt(4), dim=-1)),
    ("attention scaled by np.sqrt, masked", _attention_np_scale),
    ("scores / np.power(d, 0.5)", lambda t: t["q"] @ t["k"].transpose(-2, -1) / np.power(4, 0.5)),
    (
        "sdpa scale=np.float64",
        lambda t: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], scale=np.float64(0.5)),
    ),
    ("embeds *= np.sqrt(d)", lambda t: _scaled(t["x"], np.sqrt(4))),
    ("embeds *= np.float32", lambda t: _scaled(t["x"], np.float32(2.0))),
    (
        "torch.tensor(np.ndarray)",
        lambda t: torch.tensor(np.arange(6.0).reshape(2, 3)) * t["x"][..., 0],
    ),
    ("torch.as_tensor(np.ndarray)", lambda t: torch.as_tensor(np.ones((3, 4))) + t["x"]),
    ("torch.from_numpy", lambda t: torch.from_numpy(np.ones((3, 4), dtype=np.float32)) + t["x"]),
    ("torch.tensor(np.float64)", lambda t: torch.tensor(np.float64(1.5)) * t["x"]),
    ("index np int array", lambda t: t["x"][np.array([1, 0])]),
    ("index np int", lambda t: t["x"][np.int64(1)]),
    ("index [:, np int]", lambda t: t["x"][:, np.int64(2)]),
    ("index np bool array", lambda t: t["x"][np.array([True, False])]),
    ("index np int32 pair", lambda t: t["x"][np.array([0, 1], dtype=np.int32), np.array([2, 0])]),
    ("setitem np index, np value", lambda t: _set(t["x"], np.int64(0), np.float64(5.0))),
    ("setitem np bool mask", lambda t: _set(t["x"], t["mask"].numpy(), np.float32(0.0))),
    ("view(np.int64, -1)", lambda t: t["x"].view(np.int64(2), -1)),
    ("view((np ints))", lambda t: t["x"].view((np.int64(6), np.int64(4)))),
    ("reshape(np ints)", lambda t: t["x"].reshape(np.int64(3), np.int32(8))),
    ("torch.reshape(x, (np.int64,))", lambda t: torch.reshape(t["x"], (np.int64(-1),))),
    ("expand(torch.Size)", lambda t: t["x"][:, :1].expand(torch.Size([2, 3, 4]))),
    ("expand(np ints)", lambda t: t["x"][:, :1].expand(np.int64(2), 3, np.int64(4))),
    ("repeat(np ints)", lambda t: t["x"].repeat(np.int64(2), 1, 1)),
    ("transpose(np dims)", lambda t: t["x"].transpose(np.int64(0), np.int64(1))),
    ("permute(np dims)", lambda t: t["x"].permute(np.int64(2), 0, 1)),
    ("sum(dim=np.int64)", lambda t: t["x"].sum(dim=np.int64(-1))),
    ("softmax(np.int64 dim)", lambda t: t["x"].softmax(np.int64(-1))),
    ("cat(dim=np.int64)", lambda t: torch.cat([t["x"], t["x"]], dim=np.int64(1))),
    ("stack(tuple of tensors)", lambda t: torch.stack((t["x"], t["x"] * 2))),
    ("split(np.int64)", lambda t: t["x"].split(np.int64(2), dim=-1)),
    ("chunk(np.int64)", lambda t: t["x"].chunk(np.int64(2), dim=np.int64(-1))),
    ("clamp(np bounds)", lambda t: t["x"].clamp(min=np.float32(-0.5), max=np.float64(0.5))),
    ("torch.pow(x, np.float64)", lambda t: torch.pow(t["x"], np.float64(2))),
    ("torch.full(fill=np.float64)", lambda t: torch.full((2, 3), np.float64(1.5)) * t["x"][..., 0]),
    ("zeros(torch.Size)", lambda t: torch.zeros(t["x"].shape) + t["x"]),
    ("new_zeros(torch.Size)", lambda t: t["x"].new_zeros(torch.Size([3, 4])) + t["x"]),
    ("ones(np ints)", lambda t: torch.ones(np.int64(3), np.int64(4)) + t["x"]),
    ("arange(np.int64)", lambda t: torch.arange(np.int64(4)) * t["x"]),
    ("to(torch.float64)", lambda t: t["x"].to(torch.float64)),
    ("to(device=cpu)", lambda t: t["x"].to(device=torch.device("cpu"))),
    ("to(np.float64)", lambda t: t["x"].to(np.float64)),
    ("x[None, ..., None]", lambda t: t["x"][None, ..., None]),
    ("softmax(dtype=None)", lambda t: F.softmax(t["x"], dim=-1, dtype=None)),
    ("layer_norm(eps=np.float64)", lambda t: F.layer_norm(t["x"], (4,), eps=np.float64(1e-5))),
    ("dropout(p=np.float64, eval)", lambda t: F.dropout(t["x"], p=np.float64(0.1), training=False)),
    ("size(np.int64)", lambda t: t["x"].size(np.int64(1))),
    ("shape arithmetic", lambda t: t["x"].shape[-1] * np.float64(0.5)),
    (
        "einsum * np.float32",
        lambda t: torch.einsum("bhqd,bhkd->bhqk", t["q"], t["k"]) * np.float32(0.5),
    ),
    ("(x > np.float64).float()", lambda t: (t["x"] > np.float64(0)).float() * t["x"]),
    ("mask & np.bool_", lambda t: t["mask"] & np.bool_(True)),
    ("~mask | np.bool_", lambda t: ~t["mask"] | np.bool_(False)),
    ("triu(diagonal=np.int64)", lambda t: t["q"].triu(diagonal=np.int64(1))),
    ("Parameter * np.float64", lambda t: nn.Parameter(torch.ones(4)) * np.float64(2.0) * t["x"]),
    ("Tagged * np.float64", lambda t: _tagged(torch.ones(4)) * np.float64(2.0)),
    ("Tagged + x", lambda t: _tagged(torch.ones(4)) + t["x"]),
    ("x.numpy() when grad", lambda t: t["x"].numpy()),
    ("x.detach().numpy()", lambda t: t["x"].detach().numpy() * 2),
    ("x.tolist()", lambda t: t["x"].tolist()),
    ("x.item() of a 0-d", lambda t: t["x"].sum().item() * np.float64(2.0)),
    ("float(x) * np.float64", lambda t: float(t["x"][0, 0, 0]) * np.float64(2.0)),
    ("np.float64(x 0-d)", lambda t: np.float64(t["x"][0, 0, 0].detach())),
]


# -- running a case ----------------------------------------------------------------------------
class _Module(nn.Module):
    """The case as a module's forward, for `shapeguard.guard`."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, t: dict):
        return self.fn(t)


def _tensors_in(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _backward(out) -> None:
    losses = [
        (t.abs() if t.is_complex() else t).sum()
        for t in _tensors_in(out)
        if t.requires_grad and (t.is_floating_point() or t.is_complex())
    ]
    if losses:
        torch.stack([loss.as_subclass(torch.Tensor) for loss in losses]).sum().backward()


def _run(fn, t: dict) -> tuple:
    """("ok", output, gradients of the inputs) or ("raised", the exception)."""
    with warnings.catch_warnings():
        # torch warns once per process (TORCH_WARN_ONCE): only the first run would see it.
        # A ShapeWarning still fails (`_under`), and shapeguard's own failures raise.
        warnings.simplefilter("ignore")
        warnings.simplefilter("error", shapeguard.ShapeWarning)
        try:
            out = fn(t)
            _backward(out)
        except Exception as error:  # noqa: BLE001 (the plain run's exception is the reference)
            return ("raised", error)
    grads = {name: v.grad for name, v in t.items() if isinstance(v, torch.Tensor)}
    return ("ok", out, grads)


def _under(context: str, fn, t: dict) -> tuple:
    if context == "plain":
        return _run(fn, t)
    if context == "guard":
        module = shapeguard.guard(_Module(fn), mode="raise")
        return _run(module, t)
    mode = context.removeprefix("trace-")
    with shapeguard.trace(mode=mode) as trace:
        found = _run(fn, t)
    assert not trace.internal_errors, trace.internal_errors
    # No finding on correct code; a failure of torch's own is recorded as it always was.
    expected = {"torch_error"} if found[0] == "raised" else set()
    assert {f.kind for f in trace.findings} <= expected, [f.message for f in trace.findings]
    return found


CONTEXTS = ("trace-warn", "trace-raise", "guard")


# -- comparing runs ------------------------------------------------------------------------------
def _bits(t: torch.Tensor) -> bytes:
    return t.detach().resolve_conj().resolve_neg().contiguous().cpu().numpy().tobytes()


def _same(a, b, where: str = "result") -> None:
    assert type(a) is type(b), f"{where}: {type(b).__name__}, plainly {type(a).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), where
        assert a.requires_grad == b.requires_grad, where
        inner = getattr(a, "__tensor_flatten__", None)
        if inner is not None and type(a) is not Tagged and type(a) is not nn.Parameter:
            for name in inner()[0]:  # a wrapper subclass: its inner tensors
                _same(getattr(a, name), getattr(b, name), f"{where}.{name}")
        else:
            assert _bits(a) == _bits(b), f"{where}: other values than the plain run's"
    elif isinstance(a, np.ndarray | np.generic):
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes()), where
    elif isinstance(a, tuple | list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}[{key!r}]")
    else:
        assert repr(a) == repr(b), f"{where}: {b!r}, plainly {a!r}"


def _same_failure(plain: BaseException, traced: BaseException, context: str) -> None:
    """The same exception: torch's own RuntimeError may come as shapeguard's account of it
    (`torch_error`, a RuntimeError too, carrying torch's first line), as it always did."""
    if type(plain) is RuntimeError and isinstance(traced, ShapeError):
        assert traced.kind == "torch_error", traced
        assert str(plain).strip().splitlines()[0] in str(traced), (plain, traced)
        return
    assert type(traced) is type(plain), f"{context}: {traced!r}, plainly {plain!r}"
    assert str(traced) == str(plain), context


def assert_unchanged(fn, operand: Callable[[], object] | None = None) -> None:
    """`fn(inputs)` with autograd gives the plain run's result, gradients and exception in
    every context."""
    plain = _under("plain", fn, inputs(operand))
    for context in CONTEXTS:
        traced = _under(context, fn, inputs(operand))
        if plain[0] == "raised":
            assert traced[0] == "raised", f"{context}: ran, plainly raised {plain[1]!r}"
            _same_failure(plain[1], traced[1], context)
        else:
            assert traced[0] == "ok", f"{context}: raised {traced[1]!r}, plainly ran"
            _same(plain[1], traced[1], f"{context}: result")
            _same(plain[2], traced[2], f"{context}: gradients")


# -- the tests -------------------------------------------------------------------------------------
@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("symbol", list(BINARY))
def test_binary_operators_in_both_orders(symbol, operand):
    op = BINARY[symbol]
    assert_unchanged(lambda t: op(t["x"], t["operand"]), OPERANDS[operand])
    assert_unchanged(lambda t: op(t["operand"], t["x"]), OPERANDS[operand])


@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("symbol", list(IN_PLACE))
def test_in_place_operators(symbol, operand):
    op = IN_PLACE[symbol]
    assert_unchanged(lambda t: op(t["x"].clone(), t["operand"]), OPERANDS[operand])


@pytest.mark.parametrize("case", [fn for _, fn in CASES], ids=[name for name, _ in CASES])
def test_operator_families(case):
    assert_unchanged(case)


def test_numpy_scalar_keeps_the_tensor_type():
    # The field report's repro: a NumPy array (and a TypeError the other way round) on main.
    with shapeguard.trace(mode="warn"):
        y = torch.arange(4.0) * np.float64(2.0)
        z = np.float64(2.0) * torch.arange(4.0)
        w = torch.randn(3, requires_grad=True)
        u = w / np.power(4, 0.5)
    assert type(y) is torch.Tensor and type(z) is torch.Tensor and type(u) is torch.Tensor
    assert torch.equal(y, torch.arange(4.0) * 2) and torch.equal(z, y)
    assert u.requires_grad


def test_a_rule_never_sees_a_numpy_scalar_as_a_tensor():
    assert _checks.is_tensor(torch.zeros(1)) and _checks.is_tensor(nn.Parameter(torch.zeros(1)))
    for value in (np.float64(1.0), np.array(1.0), np.ones(3), 1.0, None, torch.Size([2])):
        assert not _checks.is_tensor(value), value
    assert _checks.leading_operands((torch.zeros(1), np.float64(2.0))) == 1


def test_model_with_a_numpy_scale_is_unchanged_and_replays():
    # CTRL's embedding scale, in a module run three times (the third replays the second).
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.proj = nn.Linear(8, 8)

        def forward(self, ids):
            x = self.emb(ids)
            x *= np.sqrt(8)
            return F.softmax(self.proj(x) / np.float32(2.0), dim=-1)

    torch.manual_seed(0)
    model = Scaled()
    ids = torch.randint(0, 16, (2, 5))
    plain = model(ids)
    guarded = shapeguard.guard(Scaled(), mode="raise")
    guarded.load_state_dict(model.state_dict())
    for _ in range(3):
        out = guarded(ids)
        assert type(out) is torch.Tensor and torch.equal(out, plain)
        out.sum().backward()
    trace = shapeguard.last_trace(guarded)
    assert trace is not None and not trace.internal_errors and trace.events


# -- transforms: vmap, grad, flex_attention ------------------------------------------------------
def test_vmap_and_grad_run_as_plainly():
    def per_row(row):
        keep = row > 0
        return torch.where(keep, row, torch.zeros_like(row)).softmax(-1) * np.float64(2.0)

    x = torch.randn(3, 5)
    plain = torch.vmap(per_row)(x)
    grads = torch.func.grad(lambda r: per_row(r).sum())(x[0])
    for mode in ("warn", "raise"):
        with shapeguard.trace(mode=mode) as trace:
            assert torch.equal(torch.vmap(per_row)(x), plain)
            assert torch.equal(torch.func.grad(lambda r: per_row(r).sum())(x[0]), grads)
        assert not trace.internal_errors and not trace.findings


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_with_a_block_mask():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    B, H, S, D = 2, 2, 128, 16  # noqa: N806 (flex_attention's blocks are 128 positions)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))  # no backward on CPU

    def run():
        mask = flex.create_block_mask(causal, B, H, S, S, device="cpu")
        return mask.to_dense(), flex.flex_attention(q, k, v, block_mask=mask)

    plain = run()
    for mode in ("warn", "raise"):
        with shapeguard.trace(mode=mode) as trace:
            traced = run()
        _same(plain, traced, mode)
        assert not trace.internal_errors and not trace.findings


# -- symbolic shapes, fx proxies -----------------------------------------------------------------
def test_symbolic_shapes_trace_the_same_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        n = x.shape[0]  # a SymInt under tracing_mode="symbolic"
        return (x * np.float64(2.0)).reshape(n, -1).softmax(-1) / np.sqrt(4)

    x = torch.randn(2, 3, 4)
    plain = make_fx(f, tracing_mode="symbolic")(x)
    with shapeguard.trace(mode="warn") as trace:
        traced = make_fx(f, tracing_mode="symbolic")(x)
    assert traced.code == plain.code
    assert not trace.internal_errors


def test_fx_symbolic_trace_sees_proxies_as_they_are():
    class M(nn.Module):
        def forward(self, x):
            return (x * np.float64(2.0)).softmax(-1) + x.shape[-1]

    plain = torch.fx.symbolic_trace(M())
    with shapeguard.trace(mode="warn") as trace:
        traced = torch.fx.symbolic_trace(M())
    assert traced.code == plain.code
    assert not trace.internal_errors


# -- containment: a broken rule or recording never changes the op ------------------------------
def _broken_rule(op: str, error: Exception):
    def broken(call):
        raise error
        yield  # a generator, as every checker is

    broken.__qualname__ = "broken"
    return _checks.Rule(broken, "broken", (op,), {"broken_kind": frozenset({"warning"})}, 9)


@pytest.fixture
def broken(monkeypatch):
    """Adds a rule that raises to the rules of an op (`add(op, error)`)."""
    original = _checks.rules_for
    extra: dict[str, tuple] = {}

    def rules_for(spelling, distributed=True):
        return (*original(spelling, distributed), *extra.get(spelling, ()))

    def add(op: str, error: Exception) -> None:
        for spelling in _ops.lookup(op).spellings:
            extra[spelling] = (_broken_rule(op, error),)

    monkeypatch.setattr(_checks, "rules_for", rules_for)
    monkeypatch.setattr(_internal, "_warned", set())
    return add


@pytest.fixture
def users_mode(monkeypatch):
    """shapeguard as users run it: its own failures contained (the suite raises them)."""
    monkeypatch.delenv("SHAPEGUARD_INTERNAL_ERRORS", raising=False)


def test_a_broken_rule_leaves_the_op_as_it_is(broken, users_mode):
    broken("mul", TypeError("a rule's bug"))  # a TypeError torch would turn into NotImplemented
    x = torch.randn(3, requires_grad=True)
    warned = pytest.warns(ShapeguardInternalWarning, match="rule broken.*mul.*TypeError: a rule's")
    with warned, shapeguard.trace() as trace:
        y = x * np.float64(2.0)
        z = x * 2.0
    assert type(y) is torch.Tensor and torch.equal(y, x * 2) and torch.equal(z, y)
    assert y.requires_grad
    # One record per place in the user's code (the two lines), text only.
    assert len({f.location for f in trace.internal_errors}) == len(trace.internal_errors) == 2
    assert all(f.location.split(":")[0].endswith("test_operands.py") for f in trace.internal_errors)
    for failure in trace.internal_errors:
        assert (failure.where, failure.op, failure.count) == ("rule broken.broken", "mul", 1)
        assert failure.error == "TypeError: a rule's bug"
        assert failure.raised_at.startswith("shapeguard/_trace/session.py:")
    assert len(trace.events) == 2  # the ops were recorded all the same
    assert (
        trace.table()
        .splitlines()[-1]
        .endswith("; 2 internal errors (shapeguard's own, contained: trace.internal_errors)")
    )


def test_other_rules_still_run_beside_a_broken_one(broken, users_mode):
    broken("softmax", ZeroDivisionError("boom"))
    scores = torch.randn(2, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeguardInternalWarning)
        with shapeguard.trace(mode="warn") as trace:
            out = F.softmax(scores, dim=-1)
    assert torch.equal(out, F.softmax(scores, dim=-1))
    assert [f.where for f in trace.internal_errors] == ["rule broken.broken"]
    assert trace.internal_errors[0].error == "ZeroDivisionError: boom"


def test_a_broken_rule_never_fails_a_run_under_W_error(broken, users_mode):
    broken("mul", RuntimeError("a rule's bug"))
    x = torch.randn(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # python -W error, pytest's filterwarnings = error
        with shapeguard.trace() as trace:
            y = x * np.float32(3.0)
    assert torch.equal(y, x * np.float32(3.0))
    assert len(trace.internal_errors) == 1


def test_a_background_trace_collects_the_failures_inside_it(broken, users_mode):
    # The pytest plugin's trace, around a block traced on its own: it sees the findings of
    # the block, and its failures too.
    from shapeguard._public_trace import Trace

    broken("mul", ValueError("a rule's bug"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeguardInternalWarning)
        with Trace(mode="warn", background=True) as outer, shapeguard.trace() as inner:
            torch.ones(2) * np.float64(2.0)
    assert [f.where for f in inner.internal_errors] == ["rule broken.broken"]
    assert [f.error for f in outer.internal_errors] == ["ValueError: a rule's bug"]
    assert outer.internal_errors[0] is not inner.internal_errors[0]


def test_a_broken_recording_leaves_the_op_as_it_is(monkeypatch, users_mode):
    from shapeguard._names import flow

    def propagate(call, outputs):
        raise KeyError("a recording bug")

    monkeypatch.setattr(flow, "propagate", propagate)
    monkeypatch.setattr(_internal, "_warned", set())
    x = torch.randn(2, 3, requires_grad=True)
    warned = pytest.warns(ShapeguardInternalWarning, match="recording failed on transpose")
    with warned, shapeguard.trace() as trace:
        y = x.transpose(0, 1) * np.float64(2.0)
        y.sum().backward()
    assert torch.equal(y, x.transpose(0, 1) * 2) and torch.equal(x.grad, torch.full((2, 3), 2.0))
    assert {f.where for f in trace.internal_errors} == {"recording"}


def test_findings_and_torch_errors_are_not_contained(broken, users_mode):
    # What shapeguard raises on purpose, and torch's own errors, pass as before.
    broken("matmul", ValueError("a rule's bug"))
    with pytest.raises(ShapeError) as raised, warnings.catch_warnings():
        warnings.simplefilter("ignore", ShapeguardInternalWarning)
        with shapeguard.trace():
            torch.randn(2, 3) @ torch.randn(4, 5)
    assert raised.value.kind == "matmul_inner"


def test_the_suite_raises_shapeguard_bugs(broken, monkeypatch):
    # In this suite (conftest sets it), a rule's bug fails loudly: an InternalError, a
    # RuntimeError that torch does not turn into NotImplemented.
    monkeypatch.setenv("SHAPEGUARD_INTERNAL_ERRORS", "raise")
    broken("mul", TypeError("a rule's bug"))
    raises = pytest.raises(InternalError, match="rule broken.broken failed on mul")
    with raises as raised, shapeguard.trace():
        torch.randn(3) * np.float64(2.0)
    assert isinstance(raised.value.__cause__, TypeError)


def test_the_suite_runs_with_internal_errors_raised():
    import os

    assert os.environ.get("SHAPEGUARD_INTERNAL_ERRORS") == "raise"


# -- the models of the field report (C1): a NumPy scale inside transformers' code -----------
def _ctrl():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "ctrl", n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=128, dff=128
    )
    return AutoModelForCausalLM.from_config(config), {"input_ids": (2, 7)}


def _pegasus_x():
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.for_model(
        "pegasus_x", d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
        max_position_embeddings=64, block_size=4, num_global_tokens=2,
    )  # fmt: skip
    return AutoModelForSeq2SeqLM.from_config(config), {
        "input_ids": (2, 8),
        "decoder_input_ids": (2, 8),
    }


def _reformer():
    from transformers import AutoConfig, AutoModelForMaskedLM

    config = AutoConfig.for_model(
        "reformer", hidden_size=64, num_attention_heads=2, attention_head_size=16,
        axial_pos_embds_dim=(32, 32), axial_pos_shape=(4, 8), max_position_embeddings=32,
        vocab_size=128, feed_forward_size=64, attn_layers=["local", "lsh"], num_hashes=1,
        local_attn_chunk_length=8, lsh_attn_chunk_length=8, num_buckets=4, is_decoder=False,
    )  # fmt: skip
    return AutoModelForMaskedLM.from_config(config), {"input_ids": (2, 32)}  # the axial grid


@pytest.mark.parametrize(
    "build", [_ctrl, _pegasus_x, _reformer], ids=["ctrl", "pegasus_x", "reformer"]
)
def test_field_report_models_run_as_plainly(build):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, shapes = build()
    model.eval()
    g = torch.Generator().manual_seed(1)
    kwargs = {name: torch.randint(0, 128, shape, generator=g) for name, shape in shapes.items()}
    with torch.no_grad():
        torch.manual_seed(2)  # Reformer's LSH draws its random rotations
        plain = model(**kwargs).logits
        for mode in ("warn", "raise"):
            torch.manual_seed(2)
            with shapeguard.trace(mode=mode) as trace:
                out = model(**kwargs).logits
            assert type(out) is torch.Tensor and torch.equal(out, plain), mode
            assert not trace.findings and not trace.internal_errors, mode
