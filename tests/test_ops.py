"""The op table (`shapeguard/_ops.py`) against torch, and as the one set of op names.

Every spelling must be a name torch 2.13 hands a `TorchFunctionMode` (or one of the few
listed below that are not torch's, each with its reason); a probe mode checks what torch
actually sends for the expressions attention code writes; declaring an op or a rule twice
is refused; and no module outside the table keeps its own set of op names.
"""

import ast
import functools
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F
from package_source import parsed
from torch.overrides import TorchFunctionMode, get_ignored_functions, get_overridable_functions

import shapeguard.attention
from shapeguard import _ops, checks
from shapeguard._errors import Violation
from shapeguard._trace import composites as _composites

# The probe runs its own mode and the registry tests swap the registry: no trace around them.
pytestmark = pytest.mark.no_shapeguard

ROOT = pathlib.Path(__file__).resolve().parent.parent

# (code, the canonical op torch's last call for it must map to). Statements run with exec.
PROBES = [
    ("t + u", "add"),
    ("2 + t", "add"),
    ("t.add(u)", "add"),
    ("t - u", "sub"),
    ("2 - t", "__rsub__"),  # the tensor arrives first: `reflected` says so
    ("t * u", "mul"),
    ("2 * t", "mul"),
    ("t / u", "div"),
    ("2 / t", "__rdiv__"),
    ("t ** 2", "pow"),
    ("2 ** t", "__rpow__"),
    ("t // 2", "__floordiv__"),
    ("t % 2", "remainder"),
    ("-t", "neg"),
    ("v += u", "add"),
    ("v -= u", "sub"),
    ("v *= 2", "mul"),
    ("v /= 2", "div"),
    ("v[0] = 1", "__setitem__"),
    ("t @ u", "matmul"),
    ("torch.matmul(t, u)", "matmul"),
    ("u.__rmatmul__(t)", "matmul"),
    ("torch.bmm(x, x.mT)", "bmm"),
    ("torch.mm(a, b)", "mm"),
    ("torch.baddbmm(x @ x.mT, x, x.mT)", "baddbmm"),
    ("torch.einsum('bhqd,bhkd->bhqk', t, u)", "einsum"),
    ("F.linear(a, w)", "linear"),
    ("t == 0", "eq"),
    ("t != 0", "ne"),
    ("t < 0", "lt"),
    ("t >= 0", "ge"),
    ("~m", "logical_not"),
    ("m & m", "logical_and"),
    ("m | m", "logical_or"),
    ("m ^ m", "logical_xor"),
    ("a.T", "t"),  # a property: torch hands the mode `T.__get__`
    ("t.mT", "mT"),
    ("a.H", "t"),
    ("t.mH", "mT"),
    ("a.t()", "t"),
    ("t.view(2, 3, 16)", "view"),
    ("t.reshape(6, 16)", "reshape"),
    ("t.flatten(2)", "flatten"),
    ("t.unflatten(-1, (2, 2))", "unflatten"),
    ("t.transpose(1, 2)", "transpose"),
    ("t.permute(0, 2, 1, 3)", "permute"),
    ("t.unsqueeze(0)", "unsqueeze"),
    ("t.squeeze()", "squeeze"),
    ("t.expand(2, 3, 4, 4)", "expand"),
    ("t.contiguous()", "contiguous"),
    ("t.float()", "float"),
    ("t.bool()", "bool"),
    ("t.to(torch.float64)", "to"),
    ("t.shape", "shape"),
    ("t.size(0)", "size"),
    ("t.dim()", "dim"),
    ("t[0]", "__getitem__"),
    ("t[:, :2]", "__getitem__"),
    ("t.narrow(1, 0, 2)", "narrow"),
    ("t.select(1, 0)", "select"),
    ("t.index_select(0, ids)", "index_select"),
    ("F.softmax(t, dim=-1)", "softmax"),
    ("t.softmax(-1)", "softmax"),
    ("torch._softmax(t, -1, False)", "softmax"),
    ("F.log_softmax(t, -1)", "log_softmax"),
    ("t.masked_fill(m, 0)", "masked_fill"),
    ("t.masked_fill_(m, 0)", "masked_fill"),
    ("torch.where(m, t, u)", "where"),
    ("F.scaled_dot_product_attention(t, u, u)", "scaled_dot_product_attention"),
    ("F.multi_head_attention_forward(*mha)", "multi_head_attention_forward"),
    ("torch.cat([t, u])", "cat"),
    ("torch.stack([t, u])", "stack"),
    ("t.split(2, dim=-1)", "split"),
    ("t.chunk(2, dim=-1)", "chunk"),
    ("t.unbind(0)", "unbind"),
    ("t.repeat_interleave(2, dim=1)", "repeat_interleave"),
    ("t.sum(-1)", "sum"),
    ("t.amax(-1)", "amax"),
    ("torch.arange(4)", "arange"),
    ("torch.zeros(2)", "zeros"),
    ("torch.ones_like(t)", "ones_like"),
    ("t.new_zeros(2)", "new_zeros"),
    ("t.cos()", "cos"),
    ("torch.sin(t)", "sin"),
    ("torch.polar(a, a)", "polar"),
    ("torch.view_as_complex(pair)", "view_as_complex"),
    ("F.embedding(ids, e)", "embedding"),
    ("F.layer_norm(t, (4,))", "layer_norm"),
    ("F.gelu(t)", "gelu"),
    ("F.dropout(t)", "dropout"),
    ("t.triu()", "triu"),
    # Names torch hands a mode that its override lists leave out.
    ("torch.dropout_(v, 0.0, False)", "dropout_"),
    ("torch._C._nn.silu_(v)", "silu_"),
    ("torch._C._nn.gelu_(v)", "gelu_"),
    ("with torch.no_grad(): pass", "_set_grad_enabled"),
]


def _operands() -> dict:
    t, u = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    d, heads = 4, 2
    x = torch.randn(3, 2, d)  # [seq, batch, d_model] for multi_head_attention_forward
    mha = (x, x, x, d, heads, torch.randn(3 * d, d), torch.zeros(3 * d), None, None, False, 0.0)
    mha += (torch.randn(d, d), torch.zeros(d))
    return {
        "torch": torch,
        "F": F,
        "t": t,
        "u": u,
        "v": t.clone(),
        "m": t > 0,
        "a": torch.randn(3, 4),
        "b": torch.randn(4, 5),
        "w": torch.randn(5, 4),
        "x": torch.randn(2, 4, 6),
        "ids": torch.tensor([0, 1]),
        "e": torch.randn(6, 4),
        "pair": torch.randn(2, 2),
        "mha": mha,
    }


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(_ops.name_of(func))
        return func(*args, **(kwargs or {}))


@functools.cache
def _received() -> dict[str, tuple[str, ...]]:
    """code -> the names torch handed the mode for it, in order."""
    namespace = _operands()
    out = {}
    for code, _ in PROBES:
        with _Recorder() as recorder:
            exec(code, namespace)
        out[code] = tuple(recorder.names)
    return out


@pytest.mark.parametrize(("code", "expected"), PROBES, ids=[code for code, _ in PROBES])
def test_torch_hands_the_mode_names_the_table_declares(code, expected):
    names = _received()[code]
    assert names, f"torch handed the mode nothing for {code}"
    undeclared = [n for n in names if _ops.declared(n) is None]
    assert not undeclared, f"{code}: {undeclared} are not in the op table"
    # The op itself comes last, after what built its arguments (`x.mT` in bmm(x, x.mT)).
    assert _ops.lookup(names[-1]).name == expected


# Spellings that are not names torch hands a mode, and why the table lists them.
NOT_TORCH = {
    **{
        name: "flash-attn's Python entry point, wrapped while a trace is open (_flash.py)"
        for name in _ops.FLASH_ENTRY_POINTS
    },
    **{
        name: "flash-attn's torch.ops kernel, reached by code that holds the op itself"
        for name in (
            "_flash_attn_forward",
            "_flash_attn_forward.default",
            "_flash_attn_varlen_forward",
            "_flash_attn_varlen_forward.default",
        )
    },
    "flex_attention": "torch's Python function over a compiled higher-order op, wrapped while "
    "a trace is open (_trace/torch_entries.py)",
    "varlen_attn": "torch.nn.attention.varlen's Python function, wrapped as flex_attention",
    "memory_efficient_attention": "xformers' Python function, wrapped as flex_attention",
    "names": "Tensor.names (named tensors) is gone in torch 2.13; earlier torch still has it",
}
# shapeguard.attention's own entry points, recorded under their own names.
SHAPEGUARD_ENTRY_POINTS = ("flash_attention", "flash_attention_varlen")


def _torch_names() -> set[str]:
    names = {_ops.name_of(f) for funcs in get_overridable_functions().values() for f in funcs}
    names |= {getattr(f, "__name__", "") for f in get_ignored_functions()}  # factories: arange
    names |= set(dir(torch.Tensor))
    names |= {n for received in _received().values() for n in received}
    return names


def test_every_spelling_is_a_name_torch_hands_a_mode():
    known = _torch_names()
    unknown = []
    for spelling, op in _ops.spellings().items():
        if spelling in known:
            continue
        if op.family == _ops.COMPOSITE:
            assert issubclass(getattr(torch.nn, spelling), torch.nn.Module), spelling
        elif spelling in SHAPEGUARD_ENTRY_POINTS:
            assert spelling in shapeguard.attention.__all__
        elif spelling not in NOT_TORCH:
            unknown.append(spelling)
    assert not unknown, f"not names torch 2.13 hands a TorchFunctionMode: {sorted(unknown)}"
    # The exceptions stay exceptions: none is (or became) torch's, each is still declared.
    assert not set(NOT_TORCH) & known
    assert set(NOT_TORCH) <= set(_ops.spellings())


def test_the_composites_are_the_modules_checked_at_their_boundary():
    assert {cls.__name__ for cls in _composites._KINDS} == set(_ops.COMPOSITES)
    assert _ops.family_ops(_ops.COMPOSITE) == set(_ops.COMPOSITES)


def test_flags_and_steps_are_the_tables_own():
    assert {op.step for op in _ops.ALL} <= {"", *_ops.STEPS}
    fused = {op.name for op in _ops.ALL if op.step == "fused"}
    flash = {op.name for op in _ops.ALL if op.family == _ops.FLASH}
    assert fused == {_ops.SDPA.name, _ops.FLEX.name} | flash
    # Events carry torch's spelling, so the report's sets hold every spelling.
    assert {"masked_fill_", "__rmatmul__"} <= _ops.shown_ops()
    assert "take_along_dim" in _ops.spellings_where(reads_table=True)
    with pytest.raises(AttributeError):
        _ops.spellings_where(no_such_flag=True)


def test_a_duplicate_declaration_is_refused_and_leaves_the_table_alone():
    before, count = _ops.spellings(), len(_ops.ALL)
    with pytest.raises(RuntimeError, match="'softmax' is declared twice"):
        _ops._op("softmax", _ops.SAME)
    # A new name with a taken spelling: refused before the new name is added.
    with pytest.raises(RuntimeError, match="'add_' is declared twice"):
        _ops._op("probe_new_op", _ops.BINARY, "add_")
    with pytest.raises(RuntimeError, match="'probe_twice' is declared twice"):
        _ops._op("probe_twice", _ops.SAME, "probe_twice")
    with pytest.raises(RuntimeError, match="step"):
        _ops._op("probe_step", _ops.SAME, step="no_such_step")
    assert _ops.spellings() == before and len(_ops.ALL) == count


@pytest.fixture
def registry(monkeypatch):
    """The checks registry as loaded, restored after the test (a rule registered here must
    never run on another test's ops)."""
    checks._index()  # loads every rule module first, so none registers into the copy
    monkeypatch.setattr(checks, "_RULES", list(checks._RULES))
    declared = {k: (set(f), set(s)) for k, (f, s) in checks._DECLARED.items()}
    monkeypatch.setattr(checks, "_DECLARED", declared)
    monkeypatch.setattr(checks, "_BY_SPELLING", checks._BY_SPELLING)
    return checks


def _probe_rule(call):
    yield from ()


def test_a_rule_registered_twice_is_refused(registry):
    softmax = _ops.by_name("softmax")
    registry.rule(softmax, kinds={"probe_kind": registry.WARNING})(_probe_rule)
    with pytest.raises(RuntimeError, match="registered twice"):
        registry.rule(softmax, kinds={"probe_kind": registry.WARNING})(_probe_rule)


def test_the_loaded_rules_are_each_registered_once_on_table_ops(registry):
    keys = [(r.check.__module__, r.check.__qualname__) for r in registry._RULES]
    assert len(keys) == len(set(keys))
    for r in registry._RULES:
        for name in r.ops:
            assert _ops.declared(name) is _ops.by_name(name), (r.check.__qualname__, name)


@pytest.mark.parametrize(
    "op",
    [
        "softmax",  # a name, not the table's entry
        _ops.lookup("probe_not_an_op"),  # the placeholder an unlisted name gets
        _ops.Op("softmax", _ops.SAME, ("softmax",)),  # a lookalike of the table's entry
    ],
    ids=["a string", "an unlisted name", "a lookalike"],
)
def test_a_rule_on_an_op_outside_the_table_is_refused(registry, op):
    with pytest.raises(RuntimeError, match="not an op of the op table"):
        registry.rule(op, kinds={"probe_kind": registry.ERROR})


def test_a_severity_outside_error_and_warning_is_refused(registry):
    with pytest.raises(RuntimeError, match="severities"):
        registry.rule(_ops.by_name("softmax"), kinds={"probe_kind": "fatal"})


def test_a_rule_yielding_a_kind_it_did_not_declare_is_an_error():
    r = checks.Rule(_probe_rule, "probe", ("softmax",), {"probe_kind": frozenset({"warning"})}, 0)
    with pytest.raises(RuntimeError, match="yielded kind 'other_kind'"):
        checks.severity(r, Violation("other_kind", "x"))
    # A declared kind takes the declared severity.
    assert checks.severity(r, Violation("probe_kind", "x")) == "warning"


# -- no other set of op names ------------------------------------------------------------
# Module-level sets of op names that remain outside the table, each with its reason.
# An entry that no longer matches fails the test too, so the list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}
SCANNED = ("shapeguard", "bench")
_SPELLINGS = frozenset(_ops.spellings())
# Parameter lists long enough to tell a re-declared signature from ("query", "key", "value").
_SIGNATURES = [op.params[:4] for op in _ops.ALL if len(op.params) >= 4]
# A constant named for one op: `_MHA_OP = "multi_head_attention_forward"`.
_OP_CONSTANT = re.compile(r"(^|_)OPS?$")


def _statements(body):
    """Assignments at module level (also under if/try/with, and in class bodies)."""
    for node in body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _statements(node.body)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            inner = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            inner += [s for handler in getattr(node, "handlers", []) for s in handler.body]
            yield from _statements(inner)


def _strings(node) -> list[str] | None:
    """The strings of a literal collection of strings, or of `"a b c".split()`."""
    if isinstance(node, ast.Set | ast.Tuple | ast.List):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = node.keys
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "split"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        return node.func.value.value.split()
    else:
        return None
    if items and all(isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items):
        return [i.value for i in items]
    return None


def _names_ops(name: str, value) -> bool:
    if isinstance(value, ast.Constant) and value.value in _SPELLINGS and _OP_CONSTANT.search(name):
        return True
    for node in ast.walk(value):
        strings = _strings(node)
        if not strings:
            continue
        # Distinct names: a pair of row names such as ("softmax", "softmax") is no set of ops.
        ops = {s for s in strings if s in _SPELLINGS}
        if len(ops) >= 2 and 2 * len(ops) > len(set(strings)):
            return True
        if isinstance(node, ast.Set) and len(ops) == len(strings):
            return True  # `frozenset({"linear"})`
        if tuple(strings[:4]) in _SIGNATURES:
            return True  # a signature bound locally instead of with _ops.bind
    return False


def _target(node) -> str:
    target = node.targets[0] if isinstance(node, ast.Assign) else node.target
    return ast.unparse(target)


def _scanned_modules():
    """(path relative to the repository, parsed module) of every scanned file but the table."""
    for root in SCANNED:
        for path in sorted((ROOT / root).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative != "shapeguard/_ops.py":
                yield relative, parsed(path)


def _sets_of_op_names() -> set[tuple[str, str]]:
    found = set()
    for relative, module in _scanned_modules():
        for node in _statements(module.body):
            name = _target(node)
            # __all__ lists public names, some of which are ops (flash_attention).
            if name != "__all__" and _names_ops(name, node.value):
                found.add((relative, name))
    return found


def _membership_tests() -> set[tuple[str, int]]:
    """`op in ("bmm", "mm")` inside a function: a set of op names all the same."""
    found = set()
    for relative, module in _scanned_modules():
        for node in ast.walk(module):
            if not isinstance(node, ast.Compare):
                continue
            for how, right in zip(node.ops, node.comparators, strict=True):
                strings = _strings(right) if isinstance(how, ast.In | ast.NotIn) else None
                ops = {s for s in strings or () if s in _SPELLINGS}
                if len(ops) >= 2 and 2 * len(ops) > len(set(strings or ())):
                    found.add((relative, node.lineno))
    return found


def test_no_function_tests_membership_in_its_own_set_of_op_names():
    found = sorted(_membership_tests())
    assert not found, f"op names listed for a membership test (query the table): {found}"


def test_no_module_keeps_its_own_set_of_op_names():
    found = _sets_of_op_names()
    new = sorted(found - set(ALLOWED))
    assert not new, f"sets of op names outside shapeguard/_ops.py (query the table): {new}"
    stale = sorted(set(ALLOWED) - found)
    assert not stale, f"allowed but gone (drop them from ALLOWED): {stale}"


@pytest.mark.parametrize(
    "source",
    [
        'OPS = frozenset({"matmul", "bmm"})',
        'OPS = frozenset({"linear"})',
        'OPS = "view reshape flatten".split()',
        'STAGE = {"matmul": 1, "softmax": 2}',
        'OP = "multi_head_attention_forward"',
        'PARAMS = ("query", "key", "value", "attn_mask")',
        'if True:\n    OPS = ("view", "reshape")',
    ],
)
def test_the_scan_sees_each_way_of_writing_a_set_of_op_names(source):
    (node,) = list(_statements(ast.parse(source).body))
    assert _names_ops(_target(node), node.value)


@pytest.mark.parametrize(
    "source",
    [
        'ROWS = ("input", "proj", "split", "scores", "mask", "softmax", "context")',
        'COLUMNS = (("dtype", "dim", False),)',
        'DTYPES = ("float16", "bfloat16")',
        'STAGES = {"softmax": ("softmax", "softmax"), "heads": ("split", "merge")}',
        'NAMES = ("query", "key", "value")',
        'device: str = "cpu"',
        'f.__name__ = "flash_attention"',
    ],
)
def test_the_scan_leaves_other_strings_alone(source):
    (node,) = list(_statements(ast.parse(source).body))
    assert not _names_ops(_target(node), node.value)
