"""One intercepted op call, as the session builds it and the rules read it (through
`checks.CallView`): its arguments, the user's site, and helpers that name its tensors.

Apart from the session so the composites and the config checks, which build calls of
their own, need not import the interceptor.
"""

import torch

from .. import _ops, _source, _tp
from .._errors import Operand
from .._memo import Memo
from .._names import axes as _axes
from .._names import dims as _dims
from .._names.axes import AxisNames, format_shape
from .meta import NO_FLAGS, TensorMeta, role_for


def op_name(func) -> str:
    return _ops.name_of(func)


def _is_tensor_method(func) -> bool:
    try:
        found = _METHODS.get(func)
    except TypeError:  # an unhashable callable
        return _read_is_method(func)
    if found is None:
        found = _METHODS.put(func, _read_is_method(func))
    return found


# Whether a function torch hands the mode is a Tensor method, by function: its names are
# read once (the same few hundred functions make every op, hence the bound).
_METHODS = Memo("tensor methods", 4096)


def _read_is_method(func) -> bool:
    qualname = getattr(func, "__qualname__", "") or ""
    if qualname.startswith(("TensorBase.", "Tensor.")):
        return True
    return getattr(func, "__name__", "") == "__get__"


class OpCall:
    """One intercepted call, with helpers that name its tensors for messages. `session` is
    the `_session.Session` that intercepted it (left untyped: this module sits below it)."""

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
        "_matches",
        "extras",
        "reach",
    )

    def __init__(self, session, func, op: str, args: tuple, kwargs: dict, site, spec=None) -> None:
        self.session = session
        self.func = func
        self.op = op
        self.spec = spec if spec is not None else _ops.lookup(op)
        self.args = args
        self.kwargs = kwargs
        self.site = site
        self.is_method = _is_tensor_method(func)
        self.flagged: frozenset = NO_FLAGS  # kinds its rules reported, and its inputs carried
        # A rule reported this op: what it does with its inputs is not evidence of what they
        # are (SDPA given [batch, seq, heads, d_k] reads the tokens as heads).
        self.reported = False
        self._bound: dict | None = None
        # Metas looked up during this call, by id: the weak table is slow to query, and the
        # rules, the axis rule and the record all read the same few tensors.
        self._metas: dict[int, TensorMeta] = {}
        self._tensors: list | None = None
        self._matches: bool | None = None  # site_matches, once per call
        # While the session records this call: (tensor, had a meta) for each tensor the
        # rules read that is not an argument (a view's `B, T, C = x.shape`).
        self.extras: list | None = None
        # The attention reach the rules read at this call (`keep_reach`): the session keeps
        # it on the trace once the rules are done (a replayed step keeps it too).
        self.reach: tuple = ()

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
            self._bound = _ops.bind(self.spec, self.args, self.kwargs, self.is_method)
        return self._bound

    # -- naming ------------------------------------------------------------------
    def site_matches(self) -> bool:
        """Whether the user's expression at this site is this very call (not a call inside it)."""
        matches = self._matches
        if matches is None:
            matches = self._matches = self._site_matches()
        return matches

    def _site_matches(self) -> bool:
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
            # The session's TensorTable.get, inlined (an entry: weak reference, meta).
            entry = self.session.metas._data.get(id(tensor))
            found = entry[1] if entry is not None and entry[0]() is tensor else None
            if self.extras is not None:
                self._note(tensor, found is not None)
            if found is not None:
                self._metas[id(tensor)] = found
        return found

    def meta_of(self, tensor) -> TensorMeta:
        """The tensor's meta; a tensor first seen here gets new axes of its own."""
        found = self._metas.get(id(tensor))
        if found is None:
            if self.extras is not None:
                self._note(tensor, tensor in self.session.metas)
            found = self._metas[id(tensor)] = self.session.meta_of(tensor)
        return found

    def _note(self, tensor, known: bool) -> None:
        extras = self.extras
        if extras is not None and not any(t is tensor for t in self.tensors()):
            extras.append((tensor, known))

    def keep_reach(self, reach) -> None:
        """Hand the session this call's attention reach (`_reach.rows.Reach`), to keep on
        the trace after the rules: the one thing a rule gives besides its findings."""
        self.reach = (*self.reach, reach)

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

    def axes(self, tensor) -> AxisNames:
        """The names of the tensor's axes (None where only the size is known)."""
        return self.meta_of(tensor).axes

    def shown_axes(self, tensor) -> AxisNames:
        """The names messages show for the tensor's axes (`_names/shown.py`): for text only,
        never for a decision."""
        return self.meta_of(tensor).shown_axes

    def shown_axis(self, tensor, dim: int) -> str:
        """`axis`, as messages show it."""
        return _axes.axis_label(self.shown_axes(tensor), dim, tensor.dim())

    def role(self, tensor, label: str | None = None) -> str | None:
        meta = self.meta(tensor)
        if meta is not None and meta.role:
            return meta.role
        return role_for(label, None)

    def operand(self, name: str, tensor, like=None) -> Operand:
        """One line of the operand block. With `like`, the tensor this one is applied to (a
        mask or a bias to the scores), its unnamed axes read as the axes they meet there."""
        shape = tuple(tensor.shape)
        axes = self.shown_axes(tensor)
        if isinstance(like, torch.Tensor):
            target = self.shown_axes(like)
            lead = len(target) - len(axes)
            axes = tuple(
                name
                or (target[lead + i] if lead + i >= 0 and like.shape[lead + i] == size else None)
                for i, (name, size) in enumerate(zip(axes, shape, strict=True))
            )
        notes = self.session.trace.axis_notes or None
        return Operand(
            name,
            f"{format_shape(shape, axes, notes)} {dtype_name(tensor.dtype)}"
            f"{_tp.operand_note(tensor)}",
        )

    def axis(self, tensor, dim: int) -> str:
        return _axes.axis_label(self.axes(tensor), dim, tensor.dim())

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

    @property
    def tp(self):
        """Tensor parallelism's view of the trace (`checks.TPView`: the session's
        `_tp_session.SessionTP`), or None while DTensor is not imported (no tensor-parallel
        run can be going on)."""
        return self.session.tp if _tp.dtensor_class() is not None else None

    def declared(self) -> dict[str, tuple[str, int]]:
        """Sizes declared by the innermost module that declares any (d_model, heads, d_k)."""
        for module in reversed(self.session.module_stack):
            found = self.session.declared_sizes(module)
            if found:
                return found
        return {}

    def root_inputs(self):
        """The root's named inputs of the forward running (`_reach.intent.RootInputs`,
        held weakly), or None outside a module's forward."""
        return self.session.root_inputs

    def output_labels(self, count: int) -> tuple[str | None, ...]:
        """The names the user's assignment gives this op's outputs (`scores = ...`)."""
        return self.session._output_labels(self, count)


# torch has a few dozen dtypes; the bound only guards against a caller that makes its own.
_DTYPE_NAMES = Memo("dtype names (trace)", 256)


def dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.put(dtype, str(dtype).removeprefix("torch."))
    return name


def _tensors_of_args(args: tuple) -> list:
    """Tensor arguments, and the tensors of a list argument (torch.cat((a, b)))."""
    found = []
    for a in args:
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, tuple | list):
            found.extend(t for t in a if isinstance(t, torch.Tensor))
    return found
