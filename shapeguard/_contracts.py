"""Shape contracts: jaxtyping annotations, checked with beartype, explained in the house format.

A contract is compiled once, when a class is guarded or a function decorated: its
annotations are resolved (string annotations too), each shape string is read into
a `_Spec`, and beartype generates one checker with the function's own parameters.
A malformed annotation is a `ContractError` then, not at the first call.

Each call pushes a jaxtyping dimension memo seeded with the sizes the module
declares (`d_model`, `n_heads`, ...), runs the beartype checker, and keeps the
bindings for the return value. Only when a check fails does the slow path run:
it re-checks the arguments one by one to learn which argument bound which dim,
finds the first axis that breaks, and raises one `ShapeError` (kind `contract`)
that names the argument, the annotation and its line, the expected and actual
shapes, the bindings so far and a fix. Tensor values are never printed.
"""

import ast
import builtins
import contextlib
import functools
import inspect
import itertools
import sys
import threading
import types
import typing
import warnings
from dataclasses import dataclass, field

import jaxtyping
import torch
from beartype import beartype
from beartype.door import is_bearable
from beartype.roar import BeartypeCallHintViolation, BeartypeException

# jaxtyping keeps its dimension bindings in a thread-local stack and has no public
# API to push one seeded with known sizes; these three functions are stable since 0.2.
from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

from . import _axes, _config, _source
from ._errors import ContractError, Finding, Operand, ShapeError, ShapeWarning
from ._session import close_session, current_session, open_session  # noqa: F401 - for _guard

is_compiling = torch.compiler.is_compiling

# Errors a failing check raises: beartype's violation, or jaxtyping's own complaint
# about a symbolic dim whose names are not bound.
_CHECK_ERRORS = (BeartypeCallHintViolation, jaxtyping.AnnotationError)

# How many distinct input signatures `check="first"` remembers before it starts over.
SEEN_LIMIT = 4096


# -- specs: one jaxtyping array type, read once --------------------------------------


@dataclass(frozen=True, slots=True)
class _Dim:
    kind: str  # "named", "fixed", "symbolic", "anon", "named_var", "anon_var"
    name: str = ""
    size: int = 0
    expr: str = ""
    broadcastable: bool = False


@dataclass(frozen=True, slots=True)
class _Spec:
    """The parts of one jaxtyping array type that checks and messages need."""

    dims: tuple[_Dim, ...]
    variadic: int | None  # index of the `*name` / `...` dim
    dtypes: tuple[str, ...] | None  # None: any dtype
    dtype_label: str  # "Float", "Bool"
    array_label: str  # "Tensor"
    dim_str: str

    @property
    def text(self) -> str:
        return f'{self.dtype_label}[{self.array_label}, "{self.dim_str}"]'


_spec_cache: dict[type, _Spec] = {}


def _is_array_type(hint) -> bool:
    return isinstance(hint, type) and issubclass(hint, jaxtyping.AbstractArray)


def _spec(array_type) -> _Spec:
    spec = _spec_cache.get(array_type)
    if spec is None:
        spec = _spec_cache[array_type] = _read_spec(array_type)
    return spec


def _read_spec(array_type) -> _Spec:
    index_variadic = array_type.index_variadic
    dims = []
    for i, d in enumerate(array_type.dims):
        broadcastable = bool(getattr(d, "broadcastable", False))
        if hasattr(d, "size"):
            dims.append(_Dim("fixed", size=d.size, broadcastable=broadcastable))
        elif hasattr(d, "elem"):
            dims.append(_Dim("symbolic", expr=str(d.elem), broadcastable=broadcastable))
        elif hasattr(d, "name"):
            kind = "named_var" if i == index_variadic else "named"
            dims.append(_Dim(kind, name=d.name, broadcastable=broadcastable))
        else:
            dims.append(_Dim("anon_var" if i == index_variadic else "anon"))
    dtypes = array_type.dtypes
    dtypes = tuple(dtypes) if isinstance(dtypes, list | tuple) else None
    dtype = getattr(array_type, "dtype", None)
    array = array_type.array_type
    return _Spec(
        dims=tuple(dims),
        variadic=index_variadic,
        dtypes=dtypes,
        dtype_label=getattr(dtype, "__name__", "Shaped"),
        array_label=getattr(array, "__name__", repr(array)),
        dim_str=array_type.dim_str,
    )


def _array_types(hint) -> list:
    """The jaxtyping array types inside a hint (through unions, Optional, tuples, lists)."""
    if _is_array_type(hint):
        return [hint]
    found = []
    for arg in typing.get_args(hint):
        found.extend(_array_types(arg))
    return found


def hint_text(hint) -> str:
    """An annotation as the user would write it: `Bool[Tensor, "batch 1 seq seq"] | None`."""
    if hint is type(None) or hint is None:
        return "None"
    if _is_array_type(hint):
        return _spec(hint).text
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return " | ".join(hint_text(a) for a in typing.get_args(hint))
    if origin is not None:
        args = typing.get_args(hint)
        name = getattr(origin, "__name__", repr(origin))
        return f"{name}[{', '.join('...' if a is Ellipsis else hint_text(a) for a in args)}]"
    if isinstance(hint, type):
        return hint.__name__
    return repr(hint)


# -- compiling a contract ---------------------------------------------------------------


@dataclass(slots=True)
class _Param:
    name: str
    kind: inspect._ParameterKind
    hint: object
    position: int | None  # index among positional arguments, None when keyword-only


@dataclass(eq=False, slots=True)
class Contract:
    """The annotations of one function, compiled: a beartype checker and the dims they name."""

    fn: object
    qualname: str
    params: tuple[_Param, ...]
    returns: object  # the return hint, or None
    dim_names: frozenset[str]  # every named dim, for binding module attributes
    symbolic_names: frozenset[str]  # names that symbolic dims refer to
    unbound_names: frozenset[str]  # symbolic names only a module attribute can bind
    method: bool  # the first parameter is `self`, not checked
    names: frozenset[str] = frozenset()  # every parameter name of the signature
    _check_params: object = None
    _check_return: object = None
    checks: int = 0  # calls whose arguments were checked (tests count them)
    # Python's per-location warning registry: the "default" filter then shows each
    # distinct message once, as for any warning, instead of on every training step.
    warn_registry: dict = field(default_factory=dict)
    _lines: dict | None = None

    def declared_at(self, name: str) -> str:
        """`file:line` of the annotation of parameter `name` ("return" for the return value)."""
        if self._lines is None:
            self._lines = _annotation_lines(self.fn)
        filename, lines = self._lines.get("", ("", {}))
        line = lines.get(name) or lines.get("def")
        return f"{_source.display_path(filename)}:{line}" if filename and line else ""

    def def_site(self) -> tuple[str, int]:
        code = getattr(self.fn, "__code__", None)
        return (code.co_filename, code.co_firstlineno) if code else ("<shapeguard>", 0)


_CACHE_ATTR = "__shapeguard_contract__"
_NO_CONTRACT = object()


def compile_contract(fn, *, method: bool) -> Contract | None:
    """The contract of `fn`'s annotations, or None when it has none.

    Kept on the function itself, so it lives exactly as long as the function does.
    """
    fn = getattr(fn, "__func__", fn)
    cached = getattr(fn, "__dict__", {}).get(_CACHE_ATTR)
    if cached is not None:
        return None if cached is _NO_CONTRACT else cached
    contract = _compile(fn, method=method)
    with contextlib.suppress(AttributeError):  # a builtin: nothing to cache on
        fn.__dict__[_CACHE_ATTR] = _NO_CONTRACT if contract is None else contract
    return contract


def _compile(fn, *, method: bool) -> Contract | None:
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    hints = _resolve_hints(fn, signature, qualname)
    if not any(_array_types(h) for h in hints.values()):
        return None  # no shape annotation: plain type hints (torch's own modules) are not ours
    params = []
    position = 0
    for index, p in enumerate(signature.parameters.values()):
        pos = None
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            pos = position
            position += 1
        elif p.kind is p.VAR_POSITIONAL:
            pos = position  # where the extra positional arguments start
        if method and index == 0:
            continue
        if p.name in hints:
            params.append(_Param(p.name, p.kind, hints[p.name], pos))
    returns = hints.get("return")

    named: set[str] = set()
    symbolic: set[str] = set()
    bound: set[str] = set()  # names the arguments bind, in order
    unbound: set[str] = set()  # symbolic names no earlier argument binds
    for p in params:
        for array_type in _array_types(p.hint):
            _read_dims(array_type, qualname, p.name, bound, symbolic, named, unbound)
    for array_type in _array_types(returns):
        _read_dims(array_type, qualname, "return", bound, symbolic, named, unbound)
    if unbound and not method:
        raise ContractError(
            f"{qualname}: a symbolic dim uses {', '.join(sorted(unbound))}, which no earlier "
            "argument binds; name it in an earlier argument's annotation"
        )

    contract = Contract(
        fn=fn,
        qualname=qualname,
        params=tuple(params),
        returns=returns,
        dim_names=frozenset(named),
        symbolic_names=frozenset(symbolic),
        unbound_names=frozenset(unbound),
        method=method,
        names=frozenset(signature.parameters),
    )
    contract._check_params = _make_checker(fn, signature, {p.name: p.hint for p in params}, qualname)
    if returns is not None:
        contract._check_return = _make_checker(
            fn, inspect.Signature([inspect.Parameter("output", inspect.Parameter.POSITIONAL_ONLY)]),
            {"output": returns}, qualname,
        )
    return contract


def _resolve_hints(fn, signature, qualname: str) -> dict:
    """Annotations by parameter name, string annotations evaluated (jaxtyping skips them)."""
    hints = {}
    items = [(p.name, p.annotation) for p in signature.parameters.values()]
    items.append(("return", signature.return_annotation))
    namespace = getattr(fn, "__globals__", {})
    for name, hint in items:
        if hint is inspect.Parameter.empty:
            continue
        if isinstance(hint, str):
            try:
                hint = eval(hint, dict(namespace))  # noqa: S307 - the user's own annotation
            except Exception as error:
                if not _meant_as_shape(hint):
                    continue  # someone else's forward reference; jaxtyping skips it too
                raise ContractError(_bad_string(qualname, name, hint, error)) from None
        hints[name] = hint
    return hints


_JAXTYPING_NAMES = ("Float", "Bool", "Int", "UInt", "Shaped", "Num", "Real", "Integer",
                    "Inexact", "Complex", "BFloat16", "Key")


def _meant_as_shape(text: str) -> bool:
    """A string annotation that was meant as a shape: a jaxtyping subscript, or bare axes."""
    if any(f"{name}[" in text or f"{name}16[" in text or f"{name}32[" in text
           for name in _JAXTYPING_NAMES):
        return True
    words = text.split()
    return len(words) > 1 and all(w.lstrip("*#_").replace("_", "").isalnum() for w in words)


def _bad_string(qualname: str, name: str, text: str, error: Exception) -> str:
    what = "the return annotation" if name == "return" else f"the annotation of {name}"
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, SyntaxError) and "[" not in text:
        why, fix = "SyntaxError", f'write Float[Tensor, "{text}"] (a bare string is not a shape contract)'
    elif isinstance(error, NameError):
        why, fix = f"NameError: {first_line}", "import the names it uses at module level"
    else:
        why, fix = f"{type(error).__name__}: {first_line}", "fix the shape string"
    return f"{qualname}: {what}, {text!r}, cannot be read ({why}); {fix}"


def _read_dims(array_type, qualname, param, bound, symbolic, named, unbound) -> None:
    """Collect the names a spec binds and uses; reject, now, a symbolic dim that jaxtyping
    would reject only at the first call."""
    spec = _spec(array_type)
    earlier = set(bound)
    for d in spec.dims:
        if d.kind in ("named", "named_var"):
            named.add(d.name)
            earlier.add(d.name)
        if d.kind != "symbolic" or "{" in d.expr:
            continue
        try:
            tree = ast.parse(d.expr, mode="eval")
        except SyntaxError:
            raise ContractError(
                f'{qualname}: {param}: dim "{d.expr}" in "{spec.dim_str}" is neither a name, '
                "a number nor an expression; separate axes with spaces"
            ) from None
        refs = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - _BUILTIN_NAMES
        symbolic.update(refs)
        unbound.update(refs - earlier)
    if param != "return":
        bound.update(d.name for d in spec.dims if d.kind == "named")


_BUILTIN_NAMES = frozenset(dir(builtins))


def _make_checker(fn, signature: inspect.Signature, hints: dict, qualname: str):
    """A beartype-checked function with `fn`'s parameters and no body."""
    namespace: dict = {}

    class _Default:
        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            return self.name

    params = []
    for i, p in enumerate(signature.parameters.values()):
        if p.default is not p.empty:
            namespace[f"_d{i}"] = p.default
            p = p.replace(default=_Default(f"_d{i}"))
        params.append(p.replace(annotation=p.empty))
    text = str(signature.replace(parameters=params, return_annotation=inspect.Signature.empty))
    exec(f"def _contract{text}: pass", namespace)  # noqa: S102 - parameter names only
    checker = namespace["_contract"]
    checker.__annotations__ = dict(hints)
    checker.__qualname__ = checker.__name__ = getattr(fn, "__name__", "contract")
    try:
        return beartype(checker)
    except BeartypeException as error:
        first = str(error).strip().splitlines()[0]
        raise ContractError(f"{qualname}: an annotation is not a type beartype can check: {first}") from None


def _annotation_lines(fn) -> dict:
    """{"": (filename, {param: line, "return": line, "def": line})} from the function's source."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    lines = {"def": code.co_firstlineno}
    try:
        source, start = inspect.getsourcelines(fn)
        tree = ast.parse("".join(_dedent(source)))
    except (OSError, TypeError, SyntaxError):
        return {"": (code.co_filename, lines)}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == fn.__name__:
            lines["def"] = start + node.lineno - 1
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None and arg.annotation is not None:
                    lines[arg.arg] = start + arg.annotation.lineno - 1
            if node.returns is not None:
                lines["return"] = start + node.returns.lineno - 1
            break
    return {"": (code.co_filename, lines)}


def _dedent(lines: list[str]) -> list[str]:
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[indent:] if x.strip() else "\n" for x in lines]


# -- module attributes --------------------------------------------------------------


_ALIAS_AXIS = {
    alias: axis for axis, aliases in _axes.ATTRIBUTE_AXES.items() for alias in (axis, *aliases)
}


@dataclass(slots=True)
class Bindings:
    """Dims a module fixes by its attributes: sizes for the memo, sources for messages."""

    sizes: dict[str, int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)


def _int_attribute(obj, name: str) -> int | None:
    value = getattr(obj, name, None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def bind_attributes(contract: Contract, module) -> Bindings:
    """Bind the contract's dims named like a module attribute to that attribute's value.

    `d_model` binds to `self.d_model`; a canonical axis name binds through its usual
    spellings (`heads` to `self.n_heads`, `d_k` to `self.head_dim` or d_model // heads).
    Raises ContractError when a symbolic dim names a size nothing binds.
    """
    bindings = Bindings()
    wanted = contract.dim_names | contract.symbolic_names
    declared = None
    config = getattr(module, "config", None)
    for name in sorted(wanted):
        value = _int_attribute(module, name)
        if value is not None:
            bindings.sizes[name], bindings.sources[name] = value, f"self.{name}"
            continue
        value = _int_attribute(config, name) if config is not None else None
        if value is not None:
            bindings.sizes[name], bindings.sources[name] = value, f"self.config.{name}"
            continue
        axis = _ALIAS_AXIS.get(name)
        if axis is None:
            continue
        if declared is None:
            declared = _axes.declared_sizes(module)
        if axis in declared:
            attr, value = declared[axis]
            if " " in attr:  # derived: d_model // heads
                attr = " // ".join(f"self.{declared[a][0]}" for a in ("d_model", "heads"))
                source = attr
            elif _int_attribute(module, attr) is not None:
                source = f"self.{attr}"
            else:
                source = f"self.config.{attr}"
            bindings.sizes[name], bindings.sources[name] = value, source
    missing = contract.unbound_names - set(bindings.sizes)
    if missing:
        names = ", ".join(sorted(missing))
        raise ContractError(
            f"{contract.qualname}: a symbolic dim uses {names}, which no argument and no "
            f"attribute of {type(module).__name__} binds; name it in an argument's annotation "
            f"or set self.{sorted(missing)[0]}"
        )
    return bindings


# -- checking a call ----------------------------------------------------------------


_local = threading.local()


def _call_stack() -> list:
    try:
        return _local.stack
    except AttributeError:
        _local.stack = []
        return _local.stack


@dataclass(slots=True)
class Call:
    """One checked call, from the arguments to the return value."""

    owner: object  # the module (or None for a function)
    key: object = None  # the input signature, for check="first"
    single: dict | None = None  # jaxtyping's dim bindings after the arguments
    variadic: dict | None = None
    exc: BaseException | None = None  # the exception being handled when the call began
    state: object = None  # the guard's state for the module, kept for the forward hook
    session: object = None  # the session open during the call, if any


def push_call(owner, key) -> Call:
    call = Call(owner, key, exc=sys.exc_info()[1])
    _call_stack().append(call)
    return call


def pop_call(owner) -> Call | None:
    stack = _call_stack()
    if stack and stack[-1].owner is owner:
        return stack.pop()
    return None


def forward_raised(call: Call, output) -> bool:
    """Whether the call ended in an exception: always_call hooks then get None as output."""
    return output is None and sys.exc_info()[1] is not call.exc


def signature_key(args: tuple, kwargs: dict) -> tuple:
    """Shapes and dtypes of the tensor arguments, types of the rest: the check="first" key.

    A training loop computes this on every step, so it is a plain loop (the fastest
    form measured: comprehensions and tuples of pairs cost more).
    """
    tensor = torch.Tensor
    key = []
    append = key.append
    for a in args:
        if isinstance(a, tensor):
            append(a.shape)
            append(a.dtype)
        else:
            append(type(a))
    for name, a in kwargs.items():
        append(name)
        if isinstance(a, tensor):
            append(a.shape)
            append(a.dtype)
        else:
            append(type(a))
    return tuple(key)


def remember(seen: dict, key) -> None:
    if len(seen) >= SEEN_LIMIT:
        seen.clear()
    seen[key] = None


def check_arguments(contract: Contract, bound: Bindings, owner, args, kwargs, *, mode, session, where) -> tuple:
    """Check the arguments; return the dim bindings (single, variadic) for the return value.

    `args` excludes `self` for a module; `owner` is that module (or None). On a
    violation: raises ShapeError (mode "raise") or warns and returns what it has.
    """
    __tracebackhide__ = True
    contract.checks += 1
    memos = push_shape_memo({})
    if bound.sizes:
        memos[0].update(bound.sizes)
    try:
        if contract.method:
            contract._check_params(owner, *args, **kwargs)
        else:
            contract._check_params(*args, **kwargs)
        single, variadic = get_shape_memo()[:2]
        return single, variadic
    except _CHECK_ERRORS:
        pass
    finally:
        pop_shape_memo()
    broken = _explain_arguments(contract, bound, args, kwargs)
    _report(broken, contract, owner, mode=mode, session=session, where=where)
    return {}, {}


def check_return(
    contract: Contract, bound: Bindings, owner, call: Call, output, args, kwargs, *, mode, session, where
) -> None:
    """Check the return value against the bindings the arguments made."""
    __tracebackhide__ = True
    memos = push_shape_memo({})
    memos[0].update(call.single or {})
    memos[1].update(call.variadic or {})
    try:
        contract._check_return(output)
        return
    except _CHECK_ERRORS:
        pass
    finally:
        pop_shape_memo()
    single, variadic, sources, _ = _walk_arguments(contract, bound, args, kwargs)
    broken = _explain_value("output", contract.returns, output, single, variadic, sources)
    broken.declared = contract.declared_at("return")
    broken.annotation = f"-> {hint_text(contract.returns)}"
    _report(broken, contract, owner, mode=mode, session=session, where=where)


# -- explaining a failure -----------------------------------------------------------------


@dataclass(slots=True)
class _Broken:
    relation: str
    label: str
    actual: str = ""
    expected: str = ""
    bindings: str = ""
    hint: str = ""
    annotation: str = ""
    declared: str = ""

    def operands(self) -> list[Operand]:
        rows = []
        if self.actual:
            rows.append(Operand(self.label, self.actual))
        if self.expected:
            rows.append(Operand("expected", self.expected))
        if self.annotation:
            where = f", declared at {self.declared}" if self.declared else ""
            rows.append(Operand("contract", f"{self.annotation}{where}"))
        if self.bindings:
            rows.append(Operand("bound", self.bindings))
        return rows


def _argument_values(contract: Contract, args: tuple, kwargs: dict):
    """(param, value) for every annotated argument present in this call, in order."""
    for p in contract.params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            for k, value in enumerate(args[p.position - contract.method :]):
                yield p, f"{p.name}[{k}]", value
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            for name, value in kwargs.items():
                if name not in contract.names:
                    yield p, name, value
        elif p.position is not None and p.position - contract.method < len(args):
            yield p, p.name, args[p.position - contract.method]
        elif p.name in kwargs:
            yield p, p.name, kwargs[p.name]


def _walk_arguments(contract: Contract, bound: Bindings, args, kwargs):
    """Check the arguments one by one, noting which argument bound which dim.

    Returns (single, variadic, sources, failing) where `failing` is the first
    (param, label, value) that breaks its annotation, or None.
    """
    single = dict(bound.sizes)
    variadic: dict = {}
    sources = dict(bound.sources)
    for p, label, value in _argument_values(contract, args, kwargs):
        memos = push_shape_memo({})
        memos[0].update(single)
        memos[1].update(variadic)
        try:
            ok = is_bearable(value, p.hint)
            after_single, after_variadic = get_shape_memo()[:2]
        except jaxtyping.AnnotationError:
            ok, after_single, after_variadic = False, single, variadic
        finally:
            pop_shape_memo()
        if not ok:
            return single, variadic, sources, (p, label, value)
        for name in after_single:
            sources.setdefault(name, label)
        for name in after_variadic:
            sources.setdefault("*" + name, label)
        single, variadic = dict(after_single), dict(after_variadic)
    return single, variadic, sources, None


def _explain_arguments(contract: Contract, bound: Bindings, args, kwargs) -> _Broken:
    single, variadic, sources, failing = _walk_arguments(contract, bound, args, kwargs)
    if failing is not None:
        p, label, value = failing
        broken = _explain_value(label, p.hint, value, single, variadic, sources)
        broken.annotation = f"{p.name}: {hint_text(p.hint)}"
        broken.declared = contract.declared_at(p.name)
        return broken
    # beartype failed but each argument passes alone: say so, without values
    return _Broken(
        relation=f"{contract.qualname}: the arguments break their contract together",
        label="arguments",
        bindings=_render_bindings(single, variadic, sources),
        hint="check the annotations of the arguments against each other",
    )


def _explain_value(label: str, hint, value, single: dict, variadic: dict, sources: dict) -> _Broken:
    """The first reason `value` breaks `hint`, given the bindings so far."""
    text = hint_text(hint)
    bindings = _render_bindings(single, variadic, sources)
    if value is None:
        return _Broken(
            relation=f"{label} is None, its contract says {text}",
            label=label,
            bindings=bindings,
            hint=f'pass {label}, or annotate it "{text} | None" if it may be left out',
        )
    origin = typing.get_origin(hint)
    if origin is tuple and isinstance(value, tuple | list):
        items = typing.get_args(hint)
        if len(items) != 2 or items[1] is not Ellipsis:
            if len(items) != len(value):
                return _Broken(
                    relation=f"{label} has {len(value)} items, its contract says {len(items)}",
                    label=label,
                    bindings=bindings,
                    hint=f"return {len(items)} values, as {text} says",
                )
            for k, (item_hint, item) in enumerate(zip(items, value, strict=True)):
                if not _passes(item, item_hint, single, variadic):
                    return _explain_value(f"{label}[{k}]", item_hint, item, single, variadic, sources)
                _bind_from(item, item_hint, single, variadic, sources, f"{label}[{k}]")
    candidates = [_spec(a) for a in _array_types(hint) if typing.get_origin(hint) is not tuple]
    if not candidates or not (hasattr(value, "shape") and hasattr(value, "dtype")):
        kind = type(value).__name__
        what = "a Tensor" if candidates else text
        return _Broken(
            relation=f"{label} is {kind}, not {what} as its contract says",
            label=label,
            bindings=bindings,
            hint=f"pass a torch.Tensor shaped {_render_expected(candidates[0], single, variadic)}"
            if candidates
            else f"pass a value of type {text}",
        )
    dtype = _dtype_name(value)
    fitting = [s for s in candidates if s.dtypes is None or dtype in s.dtypes]
    shape = tuple(int(s) for s in value.shape)
    if not fitting:
        spec = candidates[0]
        return _Broken(
            relation=f"{label} has dtype {dtype}, its contract says {spec.dtype_label}",
            label=label,
            actual=f"{_render_actual(spec, shape, single)} {dtype}",
            expected=_render_expected(spec, single, variadic),
            bindings=bindings,
            hint=_dtype_hint(label, spec),
        )
    for spec in fitting:
        trial_single, trial_variadic, trial_sources = dict(single), dict(variadic), dict(sources)
        broken = _locate(spec, shape, label, trial_single, trial_variadic, trial_sources)
        if broken is not None:
            broken.actual = _render_actual(spec, shape, trial_single)
            broken.expected = _render_expected(spec, trial_single, trial_variadic)
            broken.bindings = _render_bindings(trial_single, trial_variadic, trial_sources)
            return broken
    # jaxtyping and this walk disagree (f-string dims, pytrees): quote jaxtyping's reason
    reason = _jaxtyping_reason(fitting[0], hint, value, single, variadic)
    return _Broken(
        relation=f"{label} breaks its contract: {reason}",
        label=label,
        actual=_render_actual(fitting[0], shape, single),
        expected=_render_expected(fitting[0], single, variadic),
        bindings=bindings,
    )


def _passes(value, hint, single: dict, variadic: dict) -> bool:
    memos = push_shape_memo({})
    memos[0].update(single)
    memos[1].update(variadic)
    try:
        return is_bearable(value, hint)
    except jaxtyping.AnnotationError:
        return False
    finally:
        pop_shape_memo()


def _bind_from(value, hint, single: dict, variadic: dict, sources: dict, label: str) -> None:
    memos = push_shape_memo({})
    memos[0].update(single)
    memos[1].update(variadic)
    try:
        is_bearable(value, hint)
        after_single, after_variadic = get_shape_memo()[:2]
    finally:
        pop_shape_memo()
    for name in after_single.keys() - single.keys():
        sources[name] = label
    single.update(after_single)
    variadic.update(after_variadic)


def _jaxtyping_reason(array_type_spec: _Spec, hint, value, single, variadic) -> str:
    for array_type in _array_types(hint):
        if _spec(array_type) is array_type_spec:
            memos = push_shape_memo({})
            memos[0].update(single)
            memos[1].update(variadic)
            try:
                reason = array_type.__instancecheck_str__(value)
            except Exception as error:  # an AnnotationError names the unbound axis
                reason = str(error).splitlines()[0]
            finally:
                pop_shape_memo()
            if reason:
                return reason.rstrip(".")
    return "jaxtyping rejects it"


def _dtype_name(value) -> str:
    dtype = value.dtype
    name = getattr(getattr(dtype, "type", None), "__name__", None)
    return name or repr(dtype).rsplit(".", 1)[-1]


def _eval_symbolic(expr: str, single: dict) -> int | None:
    try:
        value = eval(expr, {"__builtins__": {"min": min, "max": max, "abs": abs}}, dict(single))  # noqa: S307
    except Exception:
        return None
    return int(value) if isinstance(value, int | float) else None


def _locate(spec: _Spec, shape: tuple, label: str, single: dict, variadic: dict, sources: dict):
    """Walk the dims as jaxtyping does; a _Broken for the first axis that breaks, else None.

    Binds new names into `single`/`variadic`/`sources` as it goes (at `label dim k`).
    """
    dims, rank = spec.dims, len(shape)
    if spec.variadic is None:
        if rank != len(dims):
            return _Broken(
                relation=f'{label} has {_n_dims(rank)}, its contract "{spec.dim_str}" has {len(dims)}',
                label=label,
                hint=_rank_hint(spec, shape, label, single),
            )
        positions = list(enumerate(dims))
        axes = list(range(rank))
    else:
        if rank < len(dims) - 1:
            return _Broken(
                relation=f'{label} has {_n_dims(rank)}, its contract "{spec.dim_str}" needs at '
                f"least {len(dims) - 1}",
                label=label,
                hint=_rank_hint(spec, shape, label, single),
            )
        i = spec.variadic
        tail = len(dims) - i - 1
        positions = [(k, dims[k]) for k in range(i)] + [(i + 1 + t, dims[i + 1 + t]) for t in range(tail)]
        axes = list(range(i)) + [rank - tail + t for t in range(tail)]
    for (_, d), axis in zip(positions, axes, strict=True):
        size = shape[axis]
        if d.kind == "anon" or (d.broadcastable and size == 1):
            continue
        if d.kind == "fixed":
            if size != d.size:
                return _Broken(
                    relation=f"{label} dim {axis} ({size}) != {d.size}, fixed by its contract",
                    label=label,
                    hint=_position_hint(spec, shape, label, single)
                    or _fixed_hint(label, axis, size, d.size),
                )
        elif d.kind == "symbolic":
            value = _eval_symbolic(d.expr, single)
            if value is not None and value != size:
                used = sorted(n for n in single if n in d.expr)
                return _Broken(
                    relation=f"{label} dim {axis} ({size}) != {d.expr} ({value})",
                    label=label,
                    hint=f"{d.expr} is {value} with "
                    + ", ".join(f"{n}={single[n]}" for n in used)
                    + f"; {label} has {size} on dim {axis}",
                )
        elif d.kind == "named":
            if d.name not in single:
                single[d.name] = size
                sources[d.name] = f"{label} dim {axis}"
            elif single[d.name] != size:
                return _named_mismatch(spec, shape, label, axis, d.name, single, sources)
    if spec.variadic is not None and dims[spec.variadic].kind == "named_var":
        d = dims[spec.variadic]
        i = spec.variadic
        new = tuple(shape[i : rank - (len(dims) - i - 1)])
        if d.name not in variadic:
            variadic[d.name] = (d.broadcastable, new)
            sources["*" + d.name] = label
            return None
        prev_broadcastable, prev = variadic[d.name]
        merged = _axes.broadcast_shapes(new, prev)
        ok = new == tuple(prev) if not (d.broadcastable or prev_broadcastable) else merged is not None
        if not ok:
            src = sources.get("*" + d.name, "an earlier argument")
            hint = f"*{d.name} is {_tuple(prev)} from {src}; {label} needs the same leading axes"
            if merged is not None:
                hint += f', or write "*#{d.name}" in both contracts if they only need to broadcast'
            return _Broken(
                relation=f"{label}.*{d.name} {_tuple(new)} != {src}.*{d.name} {_tuple(prev)}",
                label=label,
                hint=hint,
            )
    return None


def _tuple(shape) -> str:
    return str(tuple(int(s) for s in shape))


def _n_dims(rank: int) -> str:
    return f"{rank} dim" if rank == 1 else f"{rank} dims"


def _named_mismatch(spec, shape, label, axis, name, single, sources) -> _Broken:
    bound_size, size = single[name], shape[axis]
    source = sources.get(name, "an earlier argument")
    if source.startswith("self."):
        other = source
    elif source.startswith(label + " dim "):
        other = f"{label}.{name} at dim {source.rsplit(' ', 1)[1]}"
        label_name = f"{label}.{name} at dim {axis}"
        relation = f"{label_name} ({size}) != {other} ({bound_size})"
        return _Broken(
            relation=relation,
            label=label,
            hint=_position_hint(spec, shape, label, single)
            or f"{label} has {size} and {bound_size} where its contract repeats {name}; if they "
            f'may differ, give them two names (e.g. "{_other_name(name)}")',
        )
    elif " " in source:  # "self.d_model // self.n_heads"
        other = source
    else:
        other = f"{source}.{name}"
    relation = f"{label}.{name} ({size}) != {other} ({bound_size})"
    hint = _position_hint(spec, shape, label, single)
    if not hint and label == "output":
        hint = (
            f"{name} is {bound_size} ({source}) but forward returned {size} on dim {axis}; "
            "look at the op that makes the return value"
        )
    if not hint:
        if source.startswith("self."):
            attr = source.split(" ")[0][len("self.") :]
            rebuild = f", or build the module with {attr}={size}" if " " not in source else ""
            hint = (
                f"{name} is {source} = {bound_size} in this module; give {label} {bound_size} "
                f"on dim {axis}{rebuild}"
            )
        else:
            hint = (
                f"{name} was bound to {bound_size} by {source}; if {label} may differ there, "
                f'give that axis its own name in the contract (e.g. "{_other_name(name)}")'
            )
    return _Broken(relation=relation, label=label, hint=hint)


def _other_name(name: str) -> str:
    return {"seq": "seq_k", "seq_q": "seq_k", "heads": "kv_heads"}.get(name, name + "2")


def _fixed_hint(label: str, axis: int, size: int, fixed: int) -> str:
    if fixed == 1:
        return (
            f"the contract wants 1 on dim {axis} (one slice shared across that axis); take "
            f"{label}.narrow({axis}, 0, 1) if every slice is the same, or name the axis in the "
            "contract if it may carry its own size"
        )
    return f"{label} needs {fixed} on dim {axis}"


def _dtype_hint(label: str, spec: _Spec) -> str:
    conversions = {"Bool": ".bool()", "Float": ".float()", "Int": ".long()", "Integer": ".long()"}
    fix = conversions.get(spec.dtype_label)
    if fix:
        return f"convert it with {label}{fix}, or use Shaped[...] in the contract to accept any dtype"
    return f"give {label} one of the dtypes {', '.join(spec.dtypes or ())}"


def _expected_sizes(spec: _Spec, single: dict) -> list:
    """Per dim of a non-variadic spec: (size or None, accepts 1)."""
    out = []
    for d in spec.dims:
        if d.kind == "fixed":
            out.append((d.size, d.broadcastable))
        elif d.kind == "named":
            out.append((single.get(d.name), d.broadcastable))
        elif d.kind == "symbolic":
            out.append((_eval_symbolic(d.expr, single), d.broadcastable))
        else:
            out.append((None, True))
    return out


def _fits(size: int, expected) -> bool:
    want, broadcastable = expected
    return want is None or want == size or (broadcastable and size == 1)


def _position_hint(spec: _Spec, shape: tuple, label: str, single: dict) -> str:
    """A transpose or permute that makes the shape fit, when one does."""
    if spec.variadic is not None or len(shape) > 6:
        return ""
    expected = _expected_sizes(spec, single)
    if sum(1 for want, _ in expected if want is not None) < 2:
        return ""
    rank = len(shape)
    found = []
    for order in itertools.permutations(range(rank)):
        if list(order) == list(range(rank)):
            continue
        if all(_fits(shape[order[k]], expected[k]) for k in range(rank)):
            found.append(order)
    if not found:
        return ""
    swaps = [o for o in found if sum(1 for k, v in enumerate(o) if k != v) == 2]
    if swaps:
        a, b = [k for k, v in enumerate(swaps[0]) if k != v]
        return f"{label}.transpose({a}, {b}) gives {_render_plain([shape[k] for k in swaps[0]])}"
    order = found[0]
    return f"{label}.permute{tuple(order)} gives {_render_plain([shape[k] for k in order])}"


def _render_plain(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _rank_hint(spec: _Spec, shape: tuple, label: str, single: dict) -> str:
    if spec.variadic is not None:
        return f'{label} needs the axes "{spec.dim_str}"'
    expected = _expected_sizes(spec, single)
    n, m = len(expected), len(shape)
    if m < n:
        slots = _embed(shape, expected)
        if slots is None:
            return f'{label} needs the axes "{spec.dim_str}"'
        missing = [k for k in range(n) if k not in slots]
        result = [1] * n
        for k, pos in enumerate(slots):
            result[pos] = shape[k]
        chain = label + "".join(f".unsqueeze({k})" for k in missing)
        names = tuple(None if k in missing else x for k, x in enumerate(_names_for(spec, result)))
        text = f"{chain} makes it {_axes.format_shape(result, names)}"
        short = [k for k in missing if expected[k][0] not in (None, 1) and not expected[k][1]]
        if not short:
            return text
        expand = ", ".join(str(expected[k][0]) if k in short else "-1" for k in range(n))
        where = ", ".join(map(str, short))
        marks = ", ".join(f'"#{spec.dims[k].name}"' for k in short if spec.dims[k].kind == "named")
        mark = f"write {marks} for dim {where} in the contract, or " if marks else ""
        return f"{text}, which broadcasts over dim {where}; to accept that, {mark}add .expand({expand})"
    extra = [k for k in range(m) if shape[k] == 1]
    for drop in itertools.combinations(extra, m - n):
        rest = [shape[k] for k in range(m) if k not in drop]
        if all(_fits(s, e) for s, e in zip(rest, expected, strict=True)):
            chain = label + "".join(f".squeeze({k})" for k in sorted(drop, reverse=True))
            return f"{chain} makes it {_axes.format_shape(rest, _names_for(spec, rest))}"
    return f'{label} needs the axes "{spec.dim_str}"'


def _embed(shape: tuple, expected: list) -> list[int] | None:
    """Positions in `expected` for each axis of the shorter `shape`, rightmost first."""
    slots: list[int] = []
    pos = len(expected) - 1
    for k in range(len(shape) - 1, -1, -1):
        while pos >= 0 and not (expected[pos][0] is not None and _fits(shape[k], expected[pos])):
            pos -= 1
        if pos < 0:
            return None
        slots.append(pos)
        pos -= 1
    return slots[::-1]


def _names_for(spec: _Spec, shape) -> tuple:
    if spec.variadic is not None or len(shape) != len(spec.dims):
        return (None,) * len(shape)
    return tuple(
        d.name if d.kind == "named" and not (d.broadcastable and s == 1) else None
        for d, s in zip(spec.dims, shape, strict=True)
    )


def axes_for(spec: _Spec, shape: tuple) -> tuple:
    """Axis names the contract gives a tensor of this shape (None where it names none)."""
    dims, rank = spec.dims, len(shape)
    if spec.variadic is None:
        return _names_for(spec, shape)
    i = spec.variadic
    tail = len(dims) - i - 1
    if rank < len(dims) - 1:
        return (None,) * rank
    out: list = [None] * rank
    for k in range(i):
        out[k] = dims[k].name if dims[k].kind == "named" else None
    for t in range(tail):
        d = dims[i + 1 + t]
        out[rank - tail + t] = d.name if d.kind == "named" else None
    return tuple(out)


def _render_expected(spec: _Spec, single: dict, variadic: dict) -> str:
    parts = []
    for d in spec.dims:
        mark = "#" if d.broadcastable else ""
        if d.kind == "named":
            parts.append(f"{mark}{d.name}={single[d.name]}" if d.name in single else mark + d.name)
        elif d.kind == "fixed":
            parts.append(f"{mark}{d.size}")
        elif d.kind == "symbolic":
            value = _eval_symbolic(d.expr, single)
            parts.append(f"{d.expr}={value}" if value is not None else d.expr)
        elif d.kind == "named_var":
            bound = variadic.get(d.name)
            parts.append(f"*{mark}{d.name}={_tuple(bound[1])}" if bound else f"*{mark}{d.name}")
        elif d.kind == "anon_var":
            parts.append("...")
        else:
            parts.append("_")
    return "[" + ", ".join(parts) + "]"


def _render_actual(spec: _Spec, shape: tuple, single: dict) -> str:
    names = axes_for(spec, shape)
    if all(n is None for n in names) or len(names) != len(shape):
        by_size: dict[int, str | None] = {}
        for name, size in single.items():
            by_size[size] = name if by_size.get(size, name) == name else None
        names = tuple(by_size.get(s) if s > 1 else None for s in shape)
    return _axes.format_shape(shape, names)


def _render_bindings(single: dict, variadic: dict, sources: dict) -> str:
    parts = [f"{n}={v} ({sources[n]})" if n in sources else f"{n}={v}" for n, v in single.items()]
    for n, (_, shape) in variadic.items():
        src = sources.get("*" + n)
        parts.append(f"*{n}={_tuple(shape)}" + (f" ({src})" if src else ""))
    return ", ".join(parts)


# -- reporting ------------------------------------------------------------------------


def _report(broken: _Broken, contract: Contract, owner, *, mode: str, session, where: str) -> None:
    """Raise the ShapeError, or warn, and record a finding in the open trace."""
    __tracebackhide__ = True
    site = _source.user_site()
    location = site.location if site else contract.declared_at("def")
    if not where:
        where = module_description(owner, session)
    error = ShapeError(
        broken.relation,
        kind="contract",
        op=getattr(contract.fn, "__name__", "forward"),
        module=where,
        location=location,
        source=site.source if site else "",
        operands=broken.operands(),
        hint=broken.hint,
    )
    message = error.render()
    if session is not None:
        session.trace.findings.append(
            Finding(
                kind="contract",
                severity="error",
                message=message,
                op=error.op,
                module=where,
                location=location,
                hint=broken.hint,
                event_index=len(session.trace.events),
            )
        )
    if mode == "raise":
        raise error
    filename, lineno = (site.filename, site.lineno) if site else contract.def_site()
    warnings.warn_explicit(
        ShapeWarning(message, kind="contract", hint=broken.hint),
        ShapeWarning,
        filename,
        lineno,
        registry=contract.warn_registry,
    )


def module_description(module, session) -> str:
    cls = type(module).__name__
    path = session.module_path(module) if session is not None else ""
    return f"{path} ({cls})" if path else cls


# -- naming the axes of a traced forward --------------------------------------------------


def name_inputs(session, contract: Contract, single: dict, args: tuple, kwargs: dict) -> None:
    """Give the session the contract's axis names: its sizes, and the arguments' axes."""
    if not single:
        return
    by_size: dict[int, str | None] = {}
    for name, size in single.items():
        by_size[size] = name if by_size.get(size, name) == name else None
    vocab = session.vocab
    for size, name in by_size.items():
        if size > 1 and name is not None:
            vocab.add(name, size)
            if vocab.name_of(size) != name:
                # A contract is the user's own word for an axis: it overrides a name the
                # engine guessed from leading dims or attributes (`seq` for `T`).
                vocab.prefer(name, size)
    from ._meta import TensorMeta, role_for

    metas = session.metas
    for p, label, value in _argument_values(contract, args, kwargs):
        if not isinstance(value, torch.Tensor):
            continue
        for array_type in _array_types(p.hint):
            spec = _spec(array_type)
            axes = axes_for(spec, tuple(value.shape))
            if any(axes) and len(axes) == value.dim():
                meta = metas.get(value)
                if meta is None:
                    metas[value] = TensorMeta(label=label, role=role_for(label, "", ()), axes=axes)
                else:
                    meta.axes = axes
                break


# -- jaxtyping's own errors --------------------------------------------------------------


def translate_typecheck_error(error: Exception, qualname: str, location: str = "", source: str = "") -> ShapeError:
    """One ShapeError for a jaxtyping TypeCheckError, with its reason and no tensor values.

    jaxtyping's message prints the arguments, and its reason sits in `__cause__`,
    a beartype violation that prints the tensor too. Keep only the parameter, the
    reason and the bindings.
    """
    text = str(error)
    param = "output"
    marker = "whilst typechecking parameter '"
    if marker in text:
        param = text.split(marker, 1)[1].split("'", 1)[0]
    cause = str(error.__cause__ or "")
    reason = cause.rsplit(", as ", 1)[1].strip().rstrip(".") if ", as " in cause else ""
    hint_part = cause.rsplit(" violates type hint ", 1)[1] if " violates type hint " in cause else ""
    annotation = hint_part.rsplit(", as ", 1)[0].strip() if hint_part else ""
    bindings = []
    if "The current values for each jaxtyping axis annotation are as follows." in text:
        tail = text.split("The current values for each jaxtyping axis annotation are as follows.", 1)[1]
        for line in tail.strip().splitlines():
            if "=" not in line or line.startswith("The current values"):
                break
            bindings.append(line.strip())
    operands = []
    if annotation:
        operands.append(Operand("contract", _clean_annotation(annotation)))
    if bindings:
        operands.append(Operand("bound", ", ".join(bindings)))
    what = f"{param} breaks its contract" + (f": {reason}" if reason else "")
    return ShapeError(
        what,
        kind="contract",
        op=qualname.rsplit(".", 1)[-1],
        module=f"{qualname}()",
        location=location,
        source=source,
        operands=operands,
        hint="jaxtyping's own check failed inside this function; see the annotation above",
    )


def _clean_annotation(text: str) -> str:
    text = text.strip()
    if text.startswith("<class ") and text.endswith(">"):
        text = text[len("<class ") : -1].strip("'\"")
    for prefix in ("jaxtyping.", "torch."):
        text = text.replace(prefix, "")
    return text


# -- contracts on plain functions ---------------------------------------------------------


def contract(fn=None, *, mode: str = "raise", check: str = "every"):
    """Check a function's jaxtyping annotations on every call, in shapeguard's message format.

    For attention kernels written as functions. Dims are shared across the
    arguments and the return value; variadic (`*batch`), broadcastable (`#heads`)
    and symbolic (`seq+1`) dims work as in jaxtyping. A malformed annotation is a
    ContractError here, when the function is decorated.

    Args:
        fn: the function (used as `@contract`); omit it for `@contract(mode="warn")`.
        mode: "raise" a ShapeError (kind "contract"), or "warn" with a ShapeWarning.
        check: "every" call, or "first" call per distinct input-shape signature.

    Returns:
        The wrapped function; under `torch.compile` and with shapeguard disabled it
        calls `fn` directly.

    Example:
        >>> import torch, shapeguard
        >>> from jaxtyping import Float
        >>> from torch import Tensor
        >>> @shapeguard.contract
        ... def scores(q: Float[Tensor, "b h sq d"], k: Float[Tensor, "b h sk d"]
        ...            ) -> Float[Tensor, "b h sq sk"]:
        ...     return q @ k.transpose(-2, -1)
        >>> scores(torch.zeros(2, 3, 5, 11), torch.zeros(2, 3, 7, 11)).shape
        torch.Size([2, 3, 5, 7])
    """
    mode = _config.validate_mode(mode)
    if check not in ("every", "first"):
        raise ContractError(f"check={check!r} is not supported; use 'every' or 'first'")
    if fn is None:
        return functools.partial(contract, mode=mode, check=check)
    if not callable(fn):
        raise ContractError(f"shapeguard.contract decorates functions, not {type(fn).__name__}")
    compiled = compile_contract(fn, method=False)
    if compiled is None:
        raise ContractError(
            f"{getattr(fn, '__qualname__', fn)} has no shape annotations to check; annotate its "
            'arguments with jaxtyping, e.g. q: Float[Tensor, "batch heads seq d_k"]'
        )
    return _wrap(fn, compiled, mode, check)


def _wrap(fn, compiled: Contract, mode: str, check: str):
    seen: dict = {}
    no_bindings = Bindings()
    where = f"{compiled.qualname}()"
    first = check == "first"
    returns = compiled.returns is not None
    typecheck_error = jaxtyping.TypeCheckError

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        __tracebackhide__ = True
        if is_compiling():
            return fn(*args, **kwargs)
        key = None
        if first:
            key = signature_key(args, kwargs)
            if key in seen:
                return fn(*args, **kwargs)
        if not _config.is_enabled():
            return fn(*args, **kwargs)
        session = current_session()
        run_mode = session.trace.mode if session is not None else mode
        single, variadic = check_arguments(
            compiled, no_bindings, None, args, kwargs, mode=run_mode, session=session, where=where
        )
        if session is not None:
            name_inputs(session, compiled, single, args, kwargs)
        try:
            out = fn(*args, **kwargs)
        except typecheck_error as error:
            site = _source.user_site()
            raise translate_typecheck_error(
                error, compiled.qualname, site.location if site else "", site.source if site else ""
            ) from None
        if returns:
            call = Call(None, key, single, variadic)
            check_return(
                compiled, no_bindings, None, call, out, args, kwargs,
                mode=run_mode, session=session, where=where,
            )
        if key is not None:
            remember(seen, key)
        return out

    checked.__dict__[_CACHE_ATTR] = compiled
    return checked


def contract_of(obj) -> Contract | None:
    """The compiled contract of a `contract`-wrapped function or of a module's forward."""
    fn = obj if callable(obj) and not isinstance(obj, torch.nn.Module) else type(obj).forward
    found = getattr(getattr(fn, "__func__", fn), "__dict__", {}).get(_CACHE_ATTR)
    return found if isinstance(found, Contract) else None
