"""Shape contracts: jaxtyping annotations, checked with beartype, explained in the house format.

This module is the public `contract` decorator for plain functions. The work is done by
its siblings (which `guard` uses directly too):

- `_contract.spec`: one jaxtyping array type, read once into a `Spec`;
- `_contract.compile`: a function's annotations compiled into a `Contract` (a
  malformed annotation is a `MalformedContract`, a `ContractError`, when the class is guarded or the
  function decorated, not at the first call);
- `_contract.bindings`: dims bound to module attributes (`d_model`, `n_heads`, ...);
- `_contract.call`: checking a call (the arguments, then the return value) and
  the `check="first"` signature cache;
- `_contract.explain`, `_contract.locate`, `_contract.hints`, `_contract.render`:
  on a failure only, which argument and axis broke, the bindings so far and a fix;
- `_contract.report`: one `ShapeError` (kind `contract`), or a warning, and a finding.

Tensor values are never printed.
"""

import functools

import jaxtyping
import torch

from .. import _config, _source
from .._errors import ContractError, ContractTypeError, MalformedContract, Operand, ShapeError
from .._trace.current import current_session
from .annotations import annotation_site
from .bindings import Bindings
from .call import (
    Call,
    check_arguments,
    check_return,
    drop_tracebacks,
    is_compiling,
    name_inputs,
    remember,
    signature_key,
)
from .compile import CACHE_ATTR, Contract, compile_contract

# -- jaxtyping's own errors --------------------------------------------------------------


def translate_typecheck_error(
    error: Exception, qualname: str, location: str = "", source: str = ""
) -> ShapeError:
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
    hint_part = (
        cause.rsplit(" violates type hint ", 1)[1] if " violates type hint " in cause else ""
    )
    annotation = hint_part.rsplit(", as ", 1)[0].strip() if hint_part else ""
    bindings = []
    if "The current values for each jaxtyping axis annotation are as follows." in text:
        tail = text.split(
            "The current values for each jaxtyping axis annotation are as follows.", 1
        )[1]
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
        wrong = ContractError if isinstance(check, str) else ContractTypeError
        raise wrong(f"check={check!r} is not supported; use 'every' or 'first'")
    if fn is None:
        return functools.partial(contract, mode=mode, check=check)
    if not callable(fn):
        raise ContractTypeError(f"shapeguard.contract decorates functions, not {type(fn).__name__}")
    compiled = compile_contract(fn, method=False)
    if compiled is None:
        raise MalformedContract(
            f"{getattr(fn, '__qualname__', fn)} has no shape annotations to check; annotate its "
            'arguments with jaxtyping, e.g. q: Float[Tensor, "batch heads seq d_k"]',
            annotation_site(fn, "def"),
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
            drop_tracebacks(error)  # kept as the new error's context: no cycle with it
            raise translate_typecheck_error(
                error, compiled.qualname, site.location if site else "", site.source if site else ""
            ) from None
        if returns:
            call = Call(None, key, single, variadic)
            check_return(
                compiled,
                no_bindings,
                None,
                call,
                out,
                args,
                kwargs,
                mode=run_mode,
                session=session,
                where=where,
            )
        if key is not None:
            remember(seen, key)
        return out

    checked.__dict__[CACHE_ATTR] = compiled
    return checked


def contract_of(obj) -> Contract | None:
    """The compiled contract of a `contract`-wrapped function or of a module's forward."""
    fn = obj if callable(obj) and not isinstance(obj, torch.nn.Module) else type(obj).forward
    found = getattr(getattr(fn, "__func__", fn), "__dict__", {}).get(CACHE_ATTR)
    return found if isinstance(found, Contract) else None
