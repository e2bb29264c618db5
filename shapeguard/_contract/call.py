"""Checking one call against its contract: the arguments, then the return value.

Each call pushes a jaxtyping dimension memo seeded with the sizes the module
declares (`d_model`, `n_heads`, ...), runs the beartype checker, and keeps the
bindings for the return value. Only when a check fails does the slow path in
`_contract.explain` run. `check="first"` keys calls by their input signature.
"""

import sys
import threading
from dataclasses import dataclass

import jaxtyping
import torch
from beartype.roar import BeartypeCallHintViolation

# jaxtyping keeps its dimension bindings in a thread-local stack and has no public
# API to push one seeded with known sizes; these three functions are stable since 0.2.
from jaxtyping._storage import get_shape_memo, pop_shape_memo, push_shape_memo

from .._trace.current import thread_state as _session_local
from .bindings import Bindings
from .compile import Contract, argument_values
from .explain import explain_arguments, explain_return
from .report import report
from .spec import array_types, axes_for, spec_of

_torch_compiling = torch.compiler.is_compiling


def is_compiling() -> bool:
    """Whether dynamo is tracing, and this is not shapeguard's own eager check of a
    compiled module (`_compiled.check`)."""
    return _torch_compiling() and not getattr(_session_local, "eager", False)


# Errors a failing check raises: beartype's violation, or jaxtyping's own complaint
# about a symbolic dim whose names are not bound.
_CHECK_ERRORS = (BeartypeCallHintViolation, jaxtyping.AnnotationError)


def drop_tracebacks(error: BaseException) -> None:
    """Forget where beartype or jaxtyping raised `error` and the errors it was raised from
    (their wrappers' frames hold the errors they raise: error -> traceback -> frame ->
    error, a cycle through every frame below, the user's inputs with them, that only a
    full collection would free). The explanation is shapeguard's own, made from the
    contract, not from these errors."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [error]
    while todo:
        found = todo.pop()
        if found is None or id(found) in seen:
            continue
        seen.add(id(found))
        found.__traceback__ = None
        todo += (found.__cause__, found.__context__)


# How many distinct input signatures `check="first"` remembers before it starts over.
SEEN_LIMIT = 4096


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
    key: list[object] = []
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


def check_arguments(
    contract: Contract, bound: Bindings, owner, args, kwargs, *, mode, session, where
) -> tuple:
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
    except _CHECK_ERRORS as error:
        drop_tracebacks(error)
    finally:
        pop_shape_memo()
    broken = explain_arguments(contract, bound, args, kwargs)
    report(broken, contract, owner, mode=mode, session=session, where=where)
    return {}, {}


def check_return(
    contract: Contract,
    bound: Bindings,
    owner,
    call: Call,
    output,
    args,
    kwargs,
    *,
    mode,
    session,
    where,
) -> None:
    """Check the return value against the bindings the arguments made."""
    __tracebackhide__ = True
    memos = push_shape_memo({})
    memos[0].update(call.single or {})
    memos[1].update(call.variadic or {})
    try:
        contract._check_return(output)
        if session is not None:
            _claim_names(session, contract.returns, output, "output")
        return
    except _CHECK_ERRORS as error:
        drop_tracebacks(error)
    finally:
        pop_shape_memo()
    broken = explain_return(contract, bound, output, args, kwargs)
    report(broken, contract, owner, mode=mode, session=session, where=where)


def name_inputs(session, contract: Contract, single: dict, args: tuple, kwargs: dict) -> None:
    """Give the session the contract's axis names: a contract is the user's own word for
    an axis, the strongest evidence there is (it names the dims, so what flows from
    these arguments carries the names too)."""
    if not single:
        return
    for p, label, value in argument_values(contract, args, kwargs):
        _claim_names(session, p.hint, value, label)


def _claim_names(session, hint, value, label: str) -> None:
    if not isinstance(value, torch.Tensor):
        return
    from .._names import dims as D
    from .._trace.meta import role_for

    for array_type in array_types(hint):
        names = axes_for(spec_of(array_type), tuple(value.shape))
        if not any(names) or len(names) != value.dim():
            continue
        meta = session.meta_of(value)
        if meta.label is None:
            meta.label, meta.role = label, role_for(label, None)
        for axis, name in zip(meta.dims, names, strict=True):
            if name and len(axis) == 1:
                kind = D.NAME_KINDS.get(name)
                if kind is not None:
                    D.claim_kind(axis[0][0], kind, D.CONTRACT)
                D.claim_part(axis[0], name, D.CONTRACT)
        return
