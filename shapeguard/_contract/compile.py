"""Compiling a function's annotations into a `Contract`, once, when it is guarded or decorated.

The annotations are resolved (string annotations too), each shape string is read
into a `Spec`, and beartype generates one checker with the function's own
parameters. A malformed annotation is a `MalformedContract` (a `ContractError`) then, at its
line, not at the first call.
"""

import ast
import builtins
import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from beartype import beartype
from beartype.roar import BeartypeException

from .. import _source
from .._errors import MalformedContract, first_line
from .annotations import annotation_lines, annotation_site, resolve_hints
from .spec import array_types, spec_of


def _not_compiled(*args, **kwargs) -> object:
    raise RuntimeError("shapeguard: a contract checker called before `compile` set it")


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
    # beartype's checkers, set by `compile` (the return one only when there is a return hint).
    _check_params: Callable[..., object] = _not_compiled
    _check_return: Callable[..., object] = _not_compiled
    checks: int = 0  # calls whose arguments were checked (tests count them)
    # Python's per-location warning registry: the "default" filter then shows each
    # distinct message once, as for any warning, instead of on every training step.
    warn_registry: dict = field(default_factory=dict)
    _lines: dict | None = None

    def declared_at(self, name: str) -> str:
        """`file:line` of the annotation of parameter `name` ("return" for the return value)."""
        if self._lines is None:
            self._lines = annotation_lines(self.fn)
        filename, lines = self._lines.get("", ("", {}))
        line = lines.get(name) or lines.get("def")
        return f"{_source.display_path(filename)}:{line}" if filename and line else ""

    def def_site(self) -> tuple[str, int]:
        code = getattr(self.fn, "__code__", None)
        return (code.co_filename, code.co_firstlineno) if code else ("<shapeguard>", 0)


CACHE_ATTR = "__shapeguard_contract__"
_NO_CONTRACT = object()


def compile_contract(fn, *, method: bool) -> Contract | None:
    """The contract of `fn`'s annotations, or None when it has none.

    Kept on the function itself, so it lives exactly as long as the function does.
    """
    fn = getattr(fn, "__func__", fn)
    cached = getattr(fn, "__dict__", {}).get(CACHE_ATTR)
    if cached is not None:
        return None if cached is _NO_CONTRACT else cached
    contract = _compile(fn, method=method)
    with contextlib.suppress(AttributeError):  # a builtin: nothing to cache on
        fn.__dict__[CACHE_ATTR] = _NO_CONTRACT if contract is None else contract
    return contract


def _compile(fn, *, method: bool) -> Contract | None:
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    hints = resolve_hints(fn, signature, qualname)
    if not any(array_types(h) for h in hints.values()):
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
    for param in params:
        for array_type in array_types(param.hint):
            _read_dims(array_type, fn, qualname, param.name, bound, symbolic, named, unbound)
    for array_type in array_types(returns):
        _read_dims(array_type, fn, qualname, "return", bound, symbolic, named, unbound)
    if unbound and not method:
        raise MalformedContract(
            f"{qualname}: a symbolic dim uses {', '.join(sorted(unbound))}, which no earlier "
            "argument binds; name it in an earlier argument's annotation",
            annotation_site(fn, "def"),
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
    contract._check_params = _make_checker(
        fn, signature, {p.name: p.hint for p in params}, qualname
    )
    if returns is not None:
        contract._check_return = _make_checker(
            fn,
            inspect.Signature([inspect.Parameter("output", inspect.Parameter.POSITIONAL_ONLY)]),
            {"output": returns},
            qualname,
        )
    return contract


def _read_dims(array_type, fn, qualname, param, bound, symbolic, named, unbound) -> None:
    """Collect the names a spec binds and uses; reject, now, a symbolic dim that jaxtyping
    would reject only at the first call."""
    spec = spec_of(array_type)
    earlier = set(bound)
    for d in spec.dims:
        if d.kind in ("named", "named_var"):
            named.add(d.name)
            earlier.add(d.name)
        if d.kind != "symbolic" or "{" in d.expr:
            continue
        try:
            tree = _source.parse(d.expr, mode="eval")
        except SyntaxError:
            raise MalformedContract(
                f'{qualname}: {param}: dim "{d.expr}" in "{spec.dim_str}" is neither a name, '
                "a number nor an expression; separate axes with spaces",
                annotation_site(fn, param),
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
        raise MalformedContract(
            f"{qualname}: an annotation is not a type beartype can check: {first_line(error)}",
            annotation_site(fn, "def"),
        ) from None


def argument_values(contract: Contract, args: tuple, kwargs: dict):
    """(param, value) for every annotated argument present in this call, in order."""
    for p in contract.params:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            # A *args parameter always has its position (`compile` sets it).
            start = cast(int, p.position) - contract.method
            for k, value in enumerate(args[start:]):
                yield p, f"{p.name}[{k}]", value
        elif p.kind is inspect.Parameter.VAR_KEYWORD:
            for name, value in kwargs.items():
                if name not in contract.names:
                    yield p, name, value
        elif p.position is not None and p.position - contract.method < len(args):
            yield p, p.name, args[p.position - contract.method]
        elif p.name in kwargs:
            yield p, p.name, kwargs[p.name]
