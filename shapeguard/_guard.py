"""`guard` and `unguard`: checks on every forward of a module.

A guarded module gets a `forward` of its own (`_ForwardWrap`: the class's forward
between `_pre_checks` and `_post_checks`, in the instance's dict), or, for torch's
composites and for an instance that already has its own forward, one forward
pre-hook (with kwargs) and one forward hook (`always_call=True`) that run them. The
pre-check checks the forward's shape contract (its jaxtyping annotations, see
`_contract.call`) and opens a session when none is open; the post-check checks
the return value and closes the session, also when forward (or the pre-check)
raises. Under torch.compile both step aside (`_compiling`). Nothing else of
the module changes: outputs are returned as they are, and `unguard` removes exactly
what the guard put there.
"""

import functools
import inspect
import threading
import weakref
from dataclasses import dataclass, field

from . import _config
from ._errors import ContractError, ContractTypeError, ShapeError
from ._trace.current import current_session


@dataclass(slots=True)
class GuardOptions:
    mode: str = "raise"
    strict: bool = False
    calls_checked: str = "every"  # guard(check=...): "every" call, or the "first" per signature
    ops: bool = True
    max_events: int = 100_000


@dataclass(slots=True)
class _GuardState:
    options: GuardOptions
    handles: list = field(default_factory=list)
    contract: object = None  # the forward's compiled contract, or None
    bound: object = None  # dims the module's attributes bind (`_contracts.Bindings`)
    # check="first": input signatures already checked. Per instance, not per class,
    # because attribute-bound dims (d_model, n_heads) differ between instances.
    seen: dict = field(default_factory=dict)
    # Under torch.compile: input signatures checked eagerly (`_compiled`).
    compiled: dict = field(default_factory=dict)


_guarded: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_last_traces: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Sessions a guard opened and has not closed yet, per thread (a forward runs in one thread,
# and no task switches inside it): while none is open, the forward hook has no session
# to close and skips looking for one.
_owned = threading.local()


def guard(
    target=None,
    *,
    mode: str = "raise",
    strict: bool = False,
    check: str = "every",
    ops: bool = True,
    max_events: int = 100_000,
):
    """Check every forward of a module class or instance.

    A forward annotated with jaxtyping (`x: Float[Tensor, "batch seq d_model"]`) is held
    to those annotations on each call: arguments, keyword arguments and the return
    value, with dims named like a module attribute (`d_model`, `n_heads`, `d_k`, ...)
    bound to that attribute. A malformed annotation is a `ContractError` here.

    Args:
        target: an `nn.Module` subclass (used as `@guard`) or instance (guarded in place
            and returned). Omit it to get a decorator: `@guard(mode="warn")`.
        mode: "raise" (a `ShapeError` before torch fails) or "warn" (a `ShapeWarning`).
        strict: turn ShapeWarnings (legal but suspicious code) into errors.
        check: "every" call, or "first" call per distinct input-shape signature (shapes
            and dtypes of the tensor arguments, per instance); later calls with a seen
            signature cost one dictionary lookup and run unchecked (`last_trace` keeps the
            trace of the checked call).
        ops: also check every tensor op inside forward (the default). `ops=False` keeps
            only the contract on the forward's boundary: the cheap setting for training.
        max_events: events a forward's trace (`last_trace`) keeps at most; the ops past
            them are still checked.

    Returns:
        The class or the instance, guarded.

    Examples:
        >>> import torch, shapeguard
        >>> layer = shapeguard.guard(torch.nn.Linear(3, 4))
        >>> layer(torch.zeros(2, 5)).shape
        Traceback (most recent call last):
        ...
        shapeguard.ShapeError: Linear = Linear(in_features=3) got input with 5 features
        ...
    """
    options = GuardOptions(
        _config.validate_mode(mode),
        _config.validate_strict(strict),
        _validate_check(check),
        bool(ops),
        _config.validate_max_events(max_events),
    )
    if target is None:
        return functools.partial(_apply, options=options)
    return _apply(target, options=options)


def _validate_check(check: str) -> str:
    if check not in ("every", "first"):
        wrong = ContractError if isinstance(check, str) else ContractTypeError
        raise wrong(f"check={check!r} is not supported; use 'every' or 'first'")
    return check


def _apply(target, *, options: GuardOptions):
    import torch

    if inspect.isclass(target):
        if not issubclass(target, torch.nn.Module):
            raise ContractTypeError(
                f"@shapeguard.guard decorates nn.Module subclasses; {target.__name__} is not one"
            )
        return _guard_class(target, options)
    if isinstance(target, torch.nn.Module):
        _check_config(target, options)
        _install(target, options, _compile_forward(type(target)))
        return target
    raise ContractTypeError(
        f"shapeguard.guard takes an nn.Module class or instance, not {type(target).__name__}"
    )


def _compile_forward(cls):
    """The contract of `cls.forward`, compiled now so a malformed annotation fails here."""
    from ._contract.compile import compile_contract

    forward = getattr(cls, "forward", None)
    if forward is None or not callable(forward):
        return None
    return compile_contract(forward, method=True)


def _guard_class(cls, options: GuardOptions):
    _compile_forward(cls)
    original_init = cls.__init__
    if getattr(original_init, "__shapeguard_wrapped__", False):
        original_init = original_init.__wrapped__

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        __tracebackhide__ = True
        # One constructor call warns once per kind at its line: the arguments and then
        # the attributes find the same bug.
        warned: set = set()
        reported: frozenset = frozenset()
        if _config.is_enabled():
            reported = _precheck_arguments(cls, original_init, args, kwargs, options, warned)
        original_init(self, *args, **kwargs)
        if type(self) is cls or not _has_guarded_base_below(type(self), cls):
            if _config.is_enabled():
                _check_config(self, options, warned, reported)
            _install(self, options, _compile_forward(type(self)))

    __init__.__shapeguard_wrapped__ = True  # type: ignore[attr-defined]  # a marker on the wrapper
    cls.__init__ = __init__
    cls.__shapeguard_options__ = options
    return cls


def _has_guarded_base_below(actual: type, cls: type) -> bool:
    """Whether a guarded subclass of `cls` will install the hooks itself."""
    for base in actual.__mro__:
        if base is cls:
            return False
        if "__shapeguard_options__" in vars(base):
            return True
    return False


def _precheck_arguments(cls, init, args, kwargs, options: GuardOptions, warned: set) -> frozenset:
    """Check head counts from the constructor's arguments, before `__init__` runs, so
    the user sees the fix instead of the AssertionError their own check would raise.
    Returns the kinds found (the attributes' check after `__init__` skips them)."""
    __tracebackhide__ = True
    from ._names import axes as _axes
    from .checks.config import check_sizes

    try:
        bound = inspect.signature(init).bind(None, *args, **kwargs)
    except TypeError:
        return frozenset()  # the call itself is wrong; let Python say so
    bound.apply_defaults()
    values = dict(bound.arguments)
    values.pop(next(iter(values)), None)  # self

    class _Args:
        pass

    holder = _Args()
    for name, value in values.items():
        setattr(holder, name, value)
    violations = check_sizes(_axes.declared_sizes(holder), f" in {cls.__name__}(...)")
    return _report_construction(
        violations, op="__init__", module=cls.__name__, options=options, warned=warned
    )


def _check_config(
    module, options: GuardOptions, warned: set | None = None, reported: frozenset = frozenset()
) -> None:
    """Check the head counts of the module tree's attributes; the root's `reported` kinds
    were already found in the constructor's arguments."""
    __tracebackhide__ = True
    from .checks.config import check_module

    warned = set() if warned is None else warned
    for path, child in module.named_modules():
        violations = check_module(child, path)
        if not path:
            violations = (v for v in violations if v.kind not in reported)
        _report_construction(
            violations, op="config", module=type(module).__name__, options=options, warned=warned
        )


def _report_construction(
    violations, *, op: str, module: str, options: GuardOptions, warned: set
) -> frozenset:
    """Report a constructor's findings as every other finding is (`_reporting.deliver`):
    raised or warned by the guard's mode and strictness (a trace open around the
    constructor has its own, as it has for a guarded forward), silenced by a `# shapeguard:
    ignore[kind]` on the constructor's line, and recorded in the open trace. Returns the
    kinds found."""
    __tracebackhide__ = True
    from . import _reporting, _source
    from ._errors import Context

    found = set()
    for violation in violations:
        violation.op = op
        found.add(violation.kind)
        site = _source.user_site()
        session = current_session()
        mode, strict = options.mode, options.strict
        if session is not None and not session.background:
            mode, strict = session.trace.mode, session.trace.strict
        context = Context(
            module=module,
            location=site.location if site else "",
            source=site.source if site else "",
        )
        _reporting.deliver(
            # Not kept in a local: a raised error must not be held by a frame it passes
            # through (`_reporting.deliver`: the cycle it would make).
            ShapeError.from_violation(violation, context),
            violation.severity,
            mode=mode,
            strict=strict,
            trace=session.trace if session is not None else None,
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
            once=warned,
        )
    return frozenset(found)


def _install(module, options: GuardOptions, contract=None) -> None:
    # Loaded now, not by the first hook call: dynamo, tracing a compiled module's hooks,
    # cannot guard on a global that its own trace changed.
    _load_runtime()
    if module in _guarded:
        _guarded[module].options = options
        return
    state = _GuardState(options)
    if contract is not None:
        from ._contract.bindings import bind_attributes

        state.contract = contract
        state.bound = bind_attributes(contract, module)
    from ._trace import composites as _composites

    if _composites.hooks_turn_off_fast_path(module):
        # A hook on the module would turn torch's fast path off: watched from global hooks.
        state.handles = [_composites.watch(module, _pre_hook, _post_hook)]
    elif "forward" in module.__dict__ or _composites.composite_kind(module):
        # A forward of the instance's own (another tool's wrapper): hooks, around it. And
        # torch's composites, which the session checks where its hook sees them leave,
        # before the guard's closes it.
        state.handles = [
            module.register_forward_pre_hook(_pre_hook, with_kwargs=True),
            module.register_forward_hook(_post_hook, with_kwargs=True, always_call=True),
        ]
    else:
        state.handles = [_ForwardWrap(module)]
    _guarded[module] = state


class _ForwardWrap:
    """The guard's forward on one instance: the class's forward between `_pre_hook` and
    `_post_hook`, set in the instance's dict; `remove()` takes it out.

    Not module hooks: a module with hooks takes nn.Module's slower call path, eagerly and
    in every graph torch.compile makes of it (two empty hooks cost a tiny compiled module
    about 14%); a forward that dynamo inlines costs the compiled module nothing. A bound
    method (`types.MethodType`) so that `copy.deepcopy` binds the copy's to the copy, and
    pickle (which reads a method back by its name) gives the copy its class's forward."""

    __slots__ = ("module",)

    def __init__(self, module) -> None:
        import types

        self.module = weakref.ref(module)
        module.__dict__["forward"] = types.MethodType(_wrapped_forward(type(module)), module)

    def remove(self) -> None:
        module = self.module()
        wrapped = getattr(module.__dict__.get("forward"), "__func__", None) if module else None
        if getattr(wrapped, "__shapeguard_forward__", False):
            del module.__dict__["forward"]


# class -> its guarded forward, made once per class; weak, so a class made and dropped
# (a reloaded file, a test's) is not kept alive by having been guarded.
_wrappers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _wrapped_forward(cls):
    found = _wrappers.get(cls)
    if found is None:
        forward = cls.forward

        @functools.wraps(forward)
        def guarded(self, *args, **kwargs):
            __tracebackhide__ = True
            # Read at each call: a class's forward may be replaced after the wrap (and
            # through type(self), not the class: the weak table's value keeps no class).
            if _compiling(self, *args, **kwargs):
                return type(self).forward(self, *args, **kwargs)
            rt = _runtime or _load_runtime()
            try:
                # As torch runs an always_call hook: also when the pre-check raises.
                _pre_checks(rt, self, args, kwargs)
                output = type(self).forward(self, *args, **kwargs)
            except BaseException:
                _post_checks(rt, self, args, kwargs, None)
                raise
            _post_checks(rt, self, args, kwargs, output)
            return output

        guarded.__name__ = "forward"  # how pickle names a bound method: the class's forward
        guarded.__shapeguard_forward__ = True  # type: ignore[attr-defined]  # what remove() takes out
        found = _wrappers[cls] = guarded
    return found


def unguard(module):
    """Remove the hooks `guard` put on `module` (an instance); return it."""
    state = _guarded.pop(module, None)
    if state is not None:
        for handle in state.handles:
            handle.remove()
    return module


def is_guarded(module) -> bool:
    return module in _guarded


def last_trace(module):
    """The Trace of the last forward of a guarded module that opened its own trace."""
    return _last_traces.get(module)


_runtime = None


def _load_runtime():
    """The torch-side checks of a call (`_contract.call`), imported on the first hook call
    so `import shapeguard` stays free of torch, and kept in a global so later calls pay no
    import."""
    global _runtime
    if _runtime is None:
        from ._contract import call

        _runtime = call
    return _runtime


def _compiled_check(module, *args, **kwargs) -> int:
    """`_compiled.check` of a guarded module's call (what dynamo calls at trace time)."""
    __tracebackhide__ = True
    from . import _compiled

    return _compiled.check(_guarded.get(module), module, *args, **kwargs)


def _compiling(module, *args, **kwargs) -> bool:
    """Whether dynamo is tracing this call. Then the guard steps aside (jaxtyping + beartype
    give false positives on fake tensors, the session's mode would break the graph) and has
    the call checked eagerly instead, once per input signature (`_compiled.check`).

    Dynamo does not trace this function: it calls it with the real arguments while it
    traces the guard's forward and takes the result as a constant, so the compiled graph
    holds nothing of shapeguard's and its guards only this function (two of them; reading
    the checks' own compile flags in traced code cost sixteen)."""
    __tracebackhide__ = True
    rt = _runtime or _load_runtime()
    if not rt.is_compiling():
        return False
    _compiled_check(module, *args, **kwargs)
    return True


# What `torch.compiler.assume_constant_result` sets, set here so that importing shapeguard
# never imports torch._dynamo.
_compiling._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _pre_hook(module, args, kwargs):
    """The pre-check as a module hook (torch's composites, whose forward is not wrapped)."""
    __tracebackhide__ = True
    if _compiling(module, *args, **kwargs):
        return None
    _pre_checks(_runtime or _load_runtime(), module, args, kwargs)
    return None


def _pre_checks(rt, module, args, kwargs) -> None:
    __tracebackhide__ = True
    state = _guarded.get(module)
    if state is None:
        return None
    options = state.options
    key = None
    if options.calls_checked == "first":
        # Before the off switch: a seen signature skips the checks either way, and this
        # is the path a training loop takes on every step, so it stays a dict lookup.
        key = rt.signature_key(args, kwargs)
        if key in state.seen:
            return None
    if not _config.is_enabled():
        return None
    contract = state.contract
    # Popped by the post-check, which runs also when this one or forward raises.
    call = rt.push_call(module, key)
    session = current_session()
    if options.ops:
        # A background session (the pytest plugin's) lets a guarded module keep its own
        # options and last_trace; it still receives the findings when this one closes.
        if session is None or session.background:
            from ._public_trace import Trace
            from ._trace.opening import begin
            from ._trace.replay import opener

            trace = Trace(mode=options.mode, strict=options.strict, max_events=options.max_events)
            _last_traces[module] = trace
            # Closed by the post-check (or by `begin` itself, when entering the module raises).
            session = begin(trace, module, args, kwargs, opener=opener("guard", module))
            _owned.count = getattr(_owned, "count", 0) + 1
            session.owner = module
            session.owner_depth = 1
        elif session.owner is module:
            session.owner_depth += 1
    if contract is None:
        return None
    mode = session.trace.mode if session is not None else options.mode
    single, variadic = rt.check_arguments(
        contract,
        state.bound,
        module,
        args,
        kwargs,
        mode=mode,
        session=session,
        where=None,  # named only when a message is written
    )
    call.single, call.variadic = single, variadic
    call.state, call.session = state, session
    if session is not None:
        rt.name_inputs(session, contract, single, args, kwargs)
    return None


def _post_hook(module, args, kwargs, output):
    __tracebackhide__ = True
    rt = _runtime or _load_runtime()
    if rt.is_compiling():
        return None
    _post_checks(rt, module, args, kwargs, output)
    return None


def _post_checks(rt, module, args, kwargs, output) -> None:
    __tracebackhide__ = True
    try:
        call = rt.pop_call(module)
        if call is not None and not rt.forward_raised(call, output):
            _finish_call(rt, module, call, output, args, kwargs)
    finally:
        if getattr(_owned, "count", 0):
            _close_owned_session(rt, module)
    return None


def _close_owned_session(rt, module) -> None:
    session = current_session()
    if session is not None and session.owner is module:
        session.owner_depth -= 1
        if session.owner_depth <= 0:
            from ._trace.session import close_session

            _owned.count -= 1
            session.exit_module(module)
            close_session(session)


def _finish_call(rt, module, call, output, args, kwargs) -> None:
    """Check the return value, then remember the signature for check="first"."""
    __tracebackhide__ = True
    state = call.state or _guarded.get(module)
    if state is None:
        return
    contract = state.contract
    if contract is not None and contract.returns is not None and call.single is not None:
        session = call.session
        mode = session.trace.mode if session is not None else state.options.mode
        rt.check_return(
            contract,
            state.bound,
            module,
            call,
            output,
            args,
            kwargs,
            mode=mode,
            session=session,
            where=None,  # named only when a message is written
        )
    if call.key is not None:
        rt.remember(state.seen, call.key)
    # A compiled call of this signature need not be checked again (`_compiled.check`).
    rt.remember(
        state.compiled, call.key if call.key is not None else rt.signature_key(args, kwargs)
    )
