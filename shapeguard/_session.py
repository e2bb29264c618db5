"""The interceptor: one TorchFunctionMode plus global module hooks, for one trace.

A session is opened by `trace()` or by the first guarded module to run, and is
closed, whatever happens, by the same party. While it is open every torch
function, Tensor method and operator call in this thread goes through
`Session.dispatch`: the op's checker runs first (so shape bugs are reported
before torch raises), then the op, then its output is named and recorded.
"""

import inspect
import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

from . import (
    _axes,
    _composites,
    _config,
    _construction,
    _flash,
    _ops,
    _reporting,
    _source,
    _tp,
    _tp_session,
)
from . import checks as _checks
from ._axes import Axes, format_shape
from ._errors import Context, Operand, ShapeError, Violation
from ._meta import TensorMeta, TensorTable, buffer_origin, role_for
from ._names import dims as _dims
from ._names import flow as _flow
from ._names import roots as _roots
from ._record import Trace

_local = threading.local()


def current_session() -> "Session | None":
    return getattr(_local, "session", None)


def op_name(func) -> str:
    return _ops.name_of(func)


def _is_tensor_method(func) -> bool:
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return True
    return getattr(func, "__name__", "") == "__get__"


class OpCall:
    """One intercepted call, with helpers that name its tensors for messages."""

    __slots__ = (
        "func",
        "op",
        "spec",
        "args",
        "kwargs",
        "site",
        "session",
        "is_method",
        "flagged",
        "reported",
        "_bound",
        "_metas",
        "_tensors",
    )

    def __init__(
        self, session: "Session", func, op: str, args: tuple, kwargs: dict, site, spec=None
    ) -> None:
        self.session = session
        self.func = func
        self.op = op
        self.spec = spec if spec is not None else _ops.lookup(op)
        self.args = args
        self.kwargs = kwargs
        self.site = site
        self.is_method = _is_tensor_method(func)
        self.flagged: frozenset = frozenset()  # kinds its rules reported, and its inputs carried
        # A rule reported this op: what it does with its inputs is not evidence of what they
        # are (SDPA given [batch, seq, heads, d_k] reads the tokens as heads).
        self.reported = False
        self._bound: dict | None = None
        # Metas looked up during this call, by id: the weak table is slow to query, and the
        # rules, the axis rule and the record all read the same few tensors.
        self._metas: dict[int, TensorMeta] = {}
        self._tensors: list | None = None

    def tensors(self) -> list:
        """The tensor arguments, positional (and in lists: torch.cat) then keyword."""
        found = self._tensors
        if found is None:
            found = _tensors_of_args(self.args)
            found += [v for v in self.kwargs.values() if isinstance(v, torch.Tensor)]
            self._tensors = found
        return found

    def bound(self) -> dict:
        """The arguments by parameter name, as the op table declares them."""
        if self._bound is None:
            self._bound = _ops.bind(self.spec, self.args, self.kwargs)
        return self._bound

    # -- naming ------------------------------------------------------------------
    def site_matches(self) -> bool:
        """Whether the user's expression at this site is this very call (not a call inside it)."""
        site = self.site
        if site is None or site.in_module or not site.callee:
            return False
        callee = site.callee
        spec = self.spec
        return (
            callee == self.op
            or callee in spec.spellings
            or (bool(spec.symbol) and callee == spec.symbol)
        )

    def source_text(self, index: int) -> str | None:
        """The user's expression for positional argument `index`, when the user wrote the call."""
        if not self.site_matches():
            return None
        site = self.site
        texts = (site.receiver, *site.args) if self.is_method and site.receiver else site.args
        return texts[index] if index < len(texts) else None

    def meta(self, tensor) -> TensorMeta | None:
        if not isinstance(tensor, torch.Tensor):
            return None
        found = self._metas.get(id(tensor))
        if found is None:
            found = self.session.metas.get(tensor)
            if found is not None:
                self._metas[id(tensor)] = found
        return found

    def meta_of(self, tensor) -> TensorMeta:
        """The tensor's meta; a tensor first seen here gets new axes of its own."""
        found = self._metas.get(id(tensor))
        if found is None:
            found = self._metas[id(tensor)] = self.session.meta_of(tensor)
        return found

    def dims(self, tensor):
        """The provenance of each axis of `tensor` (atoms of dims, see `_names.dims`)."""
        return self.meta_of(tensor).dims

    def kind(self, tensor, dim: int, *, strong: bool = False) -> str | None:
        """What axis `dim` of `tensor` is (batch, token, feature, copy): from any evidence,
        or (`strong`) only from a parameter, structure or a contract, not a convention."""
        axis = self.dims(tensor)[dim]
        return _dims.strong_kind_of(axis) if strong else _dims.kind_of(axis)

    def label(self, index: int, default: str) -> str:
        """A name for positional argument `index`: the user's expression, else the name
        the tensor got when it was made, else `default`."""
        text = self.source_text(index)
        if text:
            return _source.short_label(text)
        tensor = self.args[index] if index < len(self.args) else None
        meta = self.meta(tensor)
        if meta is not None and meta.label:
            return meta.label
        return default

    def label_of(self, tensor, default: str) -> str:
        meta = self.meta(tensor)
        return meta.label if meta is not None and meta.label else default

    def axes(self, tensor) -> Axes:
        """The names of the tensor's axes (None where only the size is known)."""
        return self.meta_of(tensor).axes

    def role(self, tensor, label: str | None = None) -> str | None:
        meta = self.meta(tensor)
        if meta is not None and meta.role:
            return meta.role
        return role_for(label, None)

    def operand(self, name: str, tensor, like=None) -> Operand:
        """One line of the operand block. With `like`, the tensor this one is applied to (a
        mask or a bias to the scores), its unnamed axes read as the axes they meet there."""
        shape = tuple(tensor.shape)
        axes = self.axes(tensor)
        if like is not None and hasattr(like, "shape"):
            target = self.axes(like)
            lead = len(target) - len(axes)
            axes = tuple(
                name
                or (target[lead + i] if lead + i >= 0 and like.shape[lead + i] == size else None)
                for i, (name, size) in enumerate(zip(axes, shape, strict=True))
            )
        notes = self.session.trace.axis_notes or None
        return Operand(
            name,
            f"{format_shape(shape, axes, notes)} {_dtype_name(tensor.dtype)}"
            f"{_tp.operand_note(tensor)}",
        )

    def axis(self, tensor, dim: int) -> str:
        return _axes.axis_name(self.axes(tensor), dim, tensor.dim())

    # -- module context ----------------------------------------------------------
    @property
    def module(self):
        stack = self.session.module_stack
        return stack[-1] if stack else None

    @property
    def root(self):
        """The module the trace started from (None for a block of code)."""
        return self.session.root

    def module_path(self, module) -> str:
        """`module`'s dotted path under the root, as messages name it."""
        return self.session.module_path(module)

    def tp_owner(self):
        """The innermost module that declares sizes, and its tensor-parallel split
        (`_tp.Sharding`, read from DTensor weights), or (None, None)."""
        return _tp_session.owner(self.session)

    def declared(self) -> dict[str, tuple[str, int]]:
        """Sizes declared by the innermost module that declares any (d_model, heads, d_k)."""
        for module in reversed(self.session.module_stack):
            found = self.session.declared_sizes(module)
            if found:
                return found
        return {}

    def output_labels(self, count: int) -> tuple[str | None, ...]:
        """The names the user's assignment gives this op's outputs (`scores = ...`)."""
        return self.session._output_labels(self, count)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def _raw(tensor, meta: TensorMeta) -> tuple:
    """What an event keeps of a tensor: torch.Size holds ints, never the tensor (and of a
    DTensor its placements and local shape: `_tp_session.record_sharding`)."""
    dtype = tensor.dtype
    device = "cpu" if tensor.is_cpu else "meta" if tensor.is_meta else tensor.device.type
    if type(tensor) is not torch.Tensor and _tp.is_dtensor(tensor):
        sharded = _tp_session.record_sharding(tensor, meta, current_session())
        return tensor.shape, _dtype_name(dtype), device, dtype.itemsize, meta, sharded
    return tensor.shape, _dtype_name(dtype), device, dtype.itemsize, meta


class _Interceptor(TorchFunctionMode):
    def __init__(self, session: "Session") -> None:
        super().__init__()
        self.session = session

    def __torch_function__(self, func, types, args=(), kwargs=None):
        __tracebackhide__ = True
        kwargs = kwargs or {}
        return self.session.dispatch(func, args, kwargs)


class Session:
    """The live side of a Trace: mode, hooks, module stack and tensor names."""

    def __init__(self, trace: Trace, root) -> None:
        self.trace = trace
        self.root = root
        self.owner = None  # the guarded module that opened this session, if any
        self.background = trace.background
        self.owner_depth = 0
        self.metas = TensorTable()
        self._state_names: dict[int, str] | None = None
        self.module_stack: list = []
        self._paths: dict[int, str] | None = None
        self._seen_modules: set[int] = set()
        self._declared: dict[int, dict[str, tuple[str, int]]] = {}
        self._warned: set[tuple[str, str]] = set()
        self._mode = _Interceptor(self)
        self._handles: list = []
        self._dispatching = False
        self._previous: Session | None = None
        self._flash_held = False  # this session holds a wrap of flash-attn's entry points

    # -- lifecycle ---------------------------------------------------------------
    def open(self) -> None:
        hooks = torch.nn.modules.module
        self._handles = [
            hooks.register_module_forward_pre_hook(self._on_module_enter),
            hooks.register_module_forward_hook(self._on_module_exit, always_call=True),
        ]
        try:
            self._mode.__enter__()
        except BaseException:
            self._remove_hooks()
            raise
        self._previous = current_session()
        _local.session = self
        self.trace._live += 1
        self._flash_held = _flash.patch()

    def close(self) -> None:
        # First, so flash-attn's functions are restored whatever fails below (it never raises).
        held, self._flash_held = self._flash_held, False
        _flash.restore(held)
        try:
            _composites.release(self)  # a composite's suspended modes, before ours is popped
            self._mode.__exit__(None, None, None)
        finally:
            self._remove_hooks()
            if getattr(_local, "session", None) is self:
                _local.session = self._previous
            previous = self._previous
            if previous is not None and previous.background:
                previous.trace.findings.extend(self.trace.findings)
            self.trace._live -= 1
            if not self.trace._live:
                self.trace.settle()
            self.metas = TensorTable()
            self.module_stack.clear()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- modules -----------------------------------------------------------------
    def _on_module_enter(self, module, args) -> None:
        if getattr(_local, "session", None) is not self:
            return  # an inner session is tracking modules now
        if self.root is None:
            self.root = module
        self.enter_module(module, args, {})

    def _on_module_exit(self, module, args, output) -> None:
        _composites.leave(self, module, output)  # whichever session is current
        if getattr(_local, "session", None) is self:
            self.exit_module(module)

    def enter_module(self, module, args: tuple, kwargs: dict) -> None:
        if torch.compiler.is_compiling():
            return
        first = not self.module_stack
        self.module_stack.append(module)
        key = id(module)
        if key not in self._seen_modules:
            self._seen_modules.add(key)
            self.trace.modules_seen += 1
            _construction.check_entered(self, module)  # head counts, before its first op
        if first:
            self._name_inputs(module, args, kwargs)
        _composites.enter(self, module, args, kwargs)

    def exit_module(self, module) -> None:
        stack = self.module_stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is module:
                del stack[i:]
                return

    def _name_inputs(self, module, args: tuple, kwargs: dict) -> None:
        """The root's inputs: parameter names as labels, axes by the usual layouts."""
        names = _parameter_names(type(module))
        tensors = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(args)]
        tensors += list(kwargs.items())
        tensors = [leaf for name, value in tensors for leaf in _nested_tensors(name, value)]
        declared = self.declared_sizes(module)
        mains, masks = [], []
        for name, tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            meta = self.meta_of(tensor)
            if meta.label is None:
                meta.label, meta.role = name, role_for(name, None)
            if tensor.dtype == torch.bool or meta.role == "mask":
                masks.append(meta)
            else:
                _roots.claim_input(meta.dims, tensor, name, declared)
                mains.append((tensor, meta))
        _roots.pair_sequences(mains)
        for meta in masks:
            main = mains[0][1].dims if mains else ()
            _roots.guess_mask(meta.dims, main)
            _roots.mask_batch(meta.dims, main)

    def meta_of(self, tensor) -> TensorMeta:
        """The meta of `tensor`; one first seen here (a tensor made outside the trace, a
        parameter) gets new axes of its own."""
        meta = self.metas.get(tensor)
        if meta is None and type(tensor) is not torch.Tensor and _tp.is_dtensor(tensor):
            meta = _tp_session.dtensor_meta(self, tensor)  # from_local made it: its shard's axes
            if meta is not None:
                self.metas[tensor] = meta
        if meta is None:
            param = isinstance(tensor, torch.nn.Parameter)
            name = self._state_name(tensor)
            axes = _dims.fresh_axes(tuple(tensor.shape))
            for i, axis in enumerate(axes):
                for dim, _, _ in axis:
                    dim.origin = (
                        f"axis {i} of {name}"
                        if name
                        else "a parameter"
                        if param
                        else "a tensor made outside the trace"
                    )
            meta = TensorMeta(axes, param=param)
            self.metas[tensor] = meta
        return meta

    def _state_name(self, tensor) -> str:
        """The qualified name of a parameter or buffer of the root module (for messages)."""
        if self._state_names is None:
            root = self.root
            self._state_names = {}
            if root is not None and hasattr(root, "named_parameters"):
                for name, value in (*root.named_parameters(), *root.named_buffers()):
                    self._state_names[id(value)] = name
        return self._state_names.get(id(tensor), "")

    def declared_sizes(self, module) -> dict[str, tuple[str, int]]:
        """`_axes.declared_sizes`, read once per module per session."""
        key = id(module)
        found = self._declared.get(key)
        if found is None:
            found = _axes.declared_sizes(module)
            if found and _tp.dtensor_class() is not None:
                found = _tp_session.local_sizes(
                    self, module, found
                )  # a TP shard's local head counts
            self._declared[key] = found
        return found

    def module_path(self, module) -> str:
        if self._paths is None:
            root = self.root
            self._paths = (
                {id(m): name for name, m in root.named_modules()} if root is not None else {}
            )
        return self._paths.get(id(module), "")

    def module_description(self) -> tuple[str, str, str]:
        """(path, class name, "path (Class)") of the innermost module."""
        if not self.module_stack:
            return "", "", ""
        module = self.module_stack[-1]
        path = self.module_path(module)
        cls = type(module).__name__
        return path, cls, f"{path} ({cls})" if path else cls

    # -- ops ---------------------------------------------------------------------
    def dispatch(self, func, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        op = _ops.name_of(func)
        spec = _ops.lookup(op)
        if (
            spec.family == _ops.QUERY
            or self._dispatching
            or torch.compiler.is_compiling()
            # An inner session sees this op too (its mode runs first); check it once.
            or getattr(_local, "session", None) is not self
            or not _config.is_enabled()
        ):
            return func(*args, **kwargs)
        self._dispatching = True
        try:
            return self._dispatch(func, op, spec, args, kwargs)
        finally:
            self._dispatching = False

    def _dispatch(self, func, op: str, spec, args: tuple, kwargs: dict):
        __tracebackhide__ = True
        site = _source.op_site()
        if site is _source.PLUMBING:
            return _tp_session.plumbing(self, func, spec, args, kwargs)
        call = OpCall(self, func, op, args, kwargs, site, spec)
        broken = None  # the first error warn mode let through
        rules = _checks.rules_for(op)
        upstream = self._flagged(call)
        call.flagged = upstream
        if rules:
            here = id(self.module_stack[-1]) if self.module_stack else None
            on_stack = {id(m) for m in self.module_stack} | {None}
            consequence = any(module in on_stack for _, module in upstream)
            reported = set()
            for rule in rules:
                for violation in rule.check(call):
                    violation.severity = _checks.severity(rule, violation)
                    if violation.severity == "warning" and consequence:
                        # A tensor of this block already carries a warning: what follows
                        # from it is that bug again, in other words.
                        continue
                    reported.add((violation.kind, here))
                    found = self.report(violation, call)
                    broken = broken or found
            call.flagged = frozenset(reported) | upstream
            call.reported = bool(reported)
        try:
            out = func(*args, **kwargs)
        except ShapeError:
            raise
        except RuntimeError as error:
            if type(error) is not RuntimeError:
                # torch's own kind of failure (NotImplementedError: DTensor has no sharding
                # strategy for an op; OutOfMemoryError; a collective's DistError), which
                # `except` clauses in the user's code look for: kept as it is.
                raise
            # torch fails where a rule said it would: shapeguard's own account of it.
            raise (broken or self._torch_error(error, call)) from error
        self._record(call, out)
        return out

    def _context(self, call: OpCall) -> Context:
        _, _, module = self.module_description()
        site = call.site
        return Context(
            module=module,
            location=site.location if site else "",
            source=site.source if site else "",
        )

    def report(self, violation: Violation, call: OpCall) -> ShapeError | None:
        """Raise or warn for one violation, and record it as a finding. In warn mode an
        error is returned too: if torch then fails on the op, that is the error to raise."""
        __tracebackhide__ = True
        violation.op = violation.op or call.op
        context = self._context(call)
        error = ShapeError.from_violation(violation, context)
        site = call.site
        return _reporting.deliver(
            error,
            violation.severity,
            mode=self.trace.mode,
            strict=self.trace.strict,
            trace=self.trace,
            filename=site.filename if site else "<shapeguard>",
            lineno=site.lineno if site else 0,
            once=self._warned,
        )

    def _flagged(self, call: OpCall) -> frozenset:
        found: frozenset = frozenset()
        for t in call.tensors():
            meta = call.meta(t)
            if meta is not None and meta.flagged:
                found = found | meta.flagged
        return found

    def _torch_error(self, error: RuntimeError, call: OpCall) -> ShapeError:
        operands = []
        for i, arg in enumerate(call.args):
            if isinstance(arg, torch.Tensor):
                operands.append(call.operand(call.label(i, f"arg{i}"), arg))
            elif isinstance(arg, list | tuple):  # torch.cat([a, b]), torch.stack(...)
                base = call.label(i, f"arg{i}")
                items = _source.sequence_items(call.source_text(i) or "") or []
                operands += [
                    call.operand(items[j] if j < len(items) else f"{base}[{j}]", t)
                    for j, t in enumerate(arg)
                    if isinstance(t, torch.Tensor)
                ]
        operands += [
            call.operand(name, value)
            for name, value in call.kwargs.items()
            if isinstance(value, torch.Tensor)
        ]
        first_line = (
            str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        )
        context = self._context(call)
        shape_error = ShapeError(
            f"{call.op} failed in torch: {first_line}",
            kind="torch_error",
            op=call.op,
            module=context.module,
            location=context.location,
            source=context.source,
            operands=operands,
            hint="shapeguard has no rule for this failure yet; the operand shapes above are "
            "what torch was given",
        )
        self.trace.add_finding(shape_error)
        return shape_error

    def _record(self, call: OpCall, out) -> None:
        outputs = _tensors_of(out)
        if not outputs:
            return
        spec = call.spec
        in_tensors = call.tensors()
        in_metas = [call.meta_of(t) for t in in_tensors]
        made = _flow.propagate(call, outputs)
        labels = self._output_labels(call, len(outputs))
        first_label = in_metas[0].label if in_metas else None
        buffer, sliced = buffer_origin(
            spec.keeps_value, spec.slices, in_tensors, in_metas, self.module_stack
        )
        out_metas = []
        for k, (tensor, m) in enumerate(zip(outputs, made, strict=True)):
            label = labels[k] if k < len(labels) else None
            if label is None and k == 0 and first_label:
                label = self._kept_label(call, spec, in_metas, first_label)
            meta = TensorMeta(
                m.dims,
                m.tags,
                label=label,
                role=role_for(label, m.role),
                op=call.op,
                buffer=buffer,
                sliced=sliced,
                rotary=m.rotary,
                param=m.param,
                flagged=call.flagged,
                laid_out=m.laid_out,
            )
            self.metas[tensor] = meta
            out_metas.append(meta)
        trace = self.trace
        if trace.event_count >= trace.max_events:
            trace.dropped_events += 1
            return
        path, cls, _ = self.module_description()
        trace.record(
            call.op,
            path,
            cls,
            call.site,
            tuple(_raw(t, m) for t, m in zip(in_tensors, in_metas, strict=True)),
            tuple(_raw(t, m) for t, m in zip(outputs, out_metas, strict=True)),
        )

    def _kept_label(self, call: OpCall, spec, in_metas: list, first_label: str) -> str | None:
        """The label an output keeps from its input when the source line gives none."""
        if spec.family == _ops.LAYOUT and call.args and hasattr(call.args[0], "dim"):
            ndim = call.args[0].dim()
            order = _flow.layout_order(call, ndim)
            moved = [i for i, j in enumerate(order or ()) if i != j]
            if len(moved) == 2 and moved == [ndim - 2, ndim - 1]:
                return first_label + "^T"  # the last two axes swapped: K^T
        if spec.keeps_label:
            return first_label
        if spec.makes_mask and in_metas[0].role == "mask":
            return first_label  # `mask == 0` is still the mask
        if call.op == "__getitem__":
            # A slice of a tensor is that tensor: `self.bias[:, :, :T, :T]` is `bias`.
            text = call.source_text(0)
            return _source.short_label(text) if text else first_label
        return None

    def _output_labels(self, call: OpCall, count: int) -> tuple[str | None, ...]:
        site = call.site
        if site is None or not site.targets:
            return ()
        if site.in_module:
            # Inside a module called from this line: only a leaf module (Linear,
            # Dropout, LayerNorm) is one op, so only its output takes the target name.
            module = call.module
            if module is None or next(module.children(), None) is not None:
                return ()
        elif not call.site_matches():
            return ()
        if len(site.targets) == count:
            return site.targets
        return (site.targets[0],) if len(site.targets) == 1 else ()


def _tensors_of_args(args: tuple) -> list:
    """Tensor arguments, and the tensors of a list argument (torch.cat((a, b)))."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, tuple | list):
            found.extend(t for t in a if isinstance(t, torch.Tensor))
    return found


def _nested_tensors(name: str, value, depth: int = 0) -> list:
    """(label, tensor) for a root input and the tensors nested in it: a dict or dataclass
    batch (`batch.input_ids`), a few levels deep. Tuples are not looked into (a legacy
    cache is a tuple of tuples of past keys and values, not a batch)."""
    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if depth >= 3:
        return []
    if isinstance(value, dict):
        items = list(value.items())
    elif hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        items = [(f, getattr(value, f, None)) for f in value.__dataclass_fields__]
    else:
        return []
    found = []
    for key, item in items:
        found += _nested_tensors(f"{name}.{key}", item, depth + 1)
    return found


def _tensors_of(out) -> list:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, tuple | list):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


_param_cache: "weakref.WeakKeyDictionary[type, tuple[str, ...]]" = weakref.WeakKeyDictionary()


def _parameter_names(cls: "type[torch.nn.Module]") -> tuple[str, ...]:
    names = _param_cache.get(cls)
    if names is None:
        try:
            params = list(inspect.signature(cls.forward).parameters)
        except (TypeError, ValueError):
            params = []
        names = tuple(p for p in params if p != "self")
        _param_cache[cls] = names
    return names


def open_session(trace: Trace, root) -> Session:
    session = Session(trace, root)
    session.open()
    return session


def close_session(session: Session) -> None:
    session.close()
