"""What a trace knows about a live tensor: its label, role, axis provenance and origin.

Kept in a weak-keyed table, so the trace never keeps a tensor alive. A meta holds
no tensor either: its axes are atoms of `Dim`s (`_names/dims.py`), whose names
are read when a message or a table needs them, so a name learned later (the
query-key product names d_k) shows on every record of that axis.
"""

import weakref as _weakref
from operator import attrgetter as _attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .._names import dims as _dims
from .._names import shown as _shown
from .._names.dims import Axis
from .._names.roles import canonical_role

# Roles a name may give a tensor. `scores` and `attn` come from data flow only: a query-key
# product, and the softmax of one (lm_head's `logits`, a router's `probs` are neither).
_NAME_ROLES = frozenset({"Q", "K", "V", "mask", "context", "out"})


# The empty set of flags, shared: each `frozenset()` is a new object the collector tracks,
# and every recorded op's outputs hold one for the whole trace.
NO_FLAGS: frozenset = frozenset()


class Facts(NamedTuple):
    """What a meta says of its tensor besides its axes: one record, copied whole (a replay
    makes its outputs' metas from the recorded one, a step's changes to an input's meta are
    this record before and after). A field added here is carried everywhere a meta is."""

    # "q"/"k" on the two sequence axes of scores and what follows
    tags: tuple = ()
    label: str | None = None
    role: str | None = None
    op: str = ""  # the op that made it, e.g. "transpose"
    # A module buffer this tensor was read from ("bias"), and whether a slice of it was
    # taken on the way: a causal buffer used whole only fits one sequence length.
    buffer: str = ""
    sliced: bool = False
    rotary: bool = False  # computed from cos/sin: a rotary table
    param: bool = False  # a parameter, or a view of one: a weight
    # (kind, id of the module) of the warnings reported on the way to this tensor: a
    # warning on what follows from it in the same block would be the same bug again.
    flagged: frozenset = NO_FLAGS
    # Made by a transpose or permute (or a copy of one): its axis order was chosen.
    laid_out: bool = False
    # Attention weights: the side ("q" or "k") a softmax made them sum to 1 along, kept
    # while nothing may have renormalised them (`_names/flow/weights.py`); "" otherwise.
    normed: str = ""
    # The positions a softmax normalised jointly, as (axis, lo, hi) digits of this tensor's
    # axes, and whether this is those weights times values (`_names/flow/extent.py`).
    normed_over: tuple = ()
    weighted: bool = False
    # What it is to per-group normalisation over an edge index (`_trace/grouping.py`).
    grouped: tuple = ()
    # Indices: the axis along which its values are positions, an argsort's `dim` (-1: none;
    # `_names/flow/addresses.py`).
    addresses: int = -1


# The facts of a tensor first seen in a session, and of a parameter first seen.
FRESH = Facts()
FRESH_PARAM = Facts(param=True)


def _fact(name: str) -> Any:
    """`meta.<name>`: that field of its facts; set, a new record with it changed (a meta
    still owed its facts is paid first, by `TensorMeta.__getattr__`)."""

    def put(meta: "TensorMeta", value) -> None:
        meta.facts = meta.facts._replace(**{name: value})

    return property(_attrgetter(f"facts.{name}"), put)


class TensorMeta:
    """A tensor's axes (`dims`), its `Facts` (read and set by name: `meta.label`), and where
    the session made it (`slot`)."""

    __slots__ = ("dims", "facts", "slot", "_names", "_epoch", "_owed")

    # The fields of `Facts`, by name (a test checks that each one is here).
    tags = _fact("tags")
    label = _fact("label")
    role = _fact("role")
    op = _fact("op")
    buffer = _fact("buffer")
    sliced = _fact("sliced")
    rotary = _fact("rotary")
    param = _fact("param")
    flagged = _fact("flagged")
    laid_out = _fact("laid_out")
    normed = _fact("normed")
    normed_over = _fact("normed_over")
    weighted = _fact("weighted")
    grouped = _fact("grouped")
    addresses = _fact("addresses")

    def __init__(
        self,
        dims: tuple[Axis, ...],
        tags: tuple[str | None, ...] = (),
        **facts,
    ) -> None:
        self.dims = dims
        self.facts = Facts(tags=tags, **facts)
        # Where the session made it: the op's step and output (`_replay`), or the order in
        # which a tensor made outside the trace was first seen (a negative number).
        self.slot = 0
        self._names: tuple[str | None, ...] | None = None
        self._epoch = -1
        # The weak reference of the ledger that still owes this meta its fields (None: it
        # has them). See `_trace/owed.py`.
        self._owed: _weakref.ref | None = None

    @classmethod
    def made(cls, dims, facts: Facts, slot) -> "TensorMeta":
        """A meta of these axes and facts, as a recorded op makes its outputs."""
        meta = cls.__new__(cls)
        meta.slot = slot
        meta.fill(dims, facts)
        return meta

    def fill(self, dims, facts: Facts) -> None:
        """Set the axes and the facts (of a meta made, or owed: `_trace/owed.py`)."""
        self.dims = dims
        self.facts = facts
        self._names = None
        self._epoch = -1
        self._owed = None

    if not TYPE_CHECKING:  # (for mypy, a class with __getattr__ has every attribute)

        def __getattr__(self, name: str):
            # Only a field not set yet gets here: a meta whose replayed step is still owed
            # (`_trace/owed.py`). Its ledger makes every step it owes, this one included.
            if name != "_owed" and not name.startswith("__"):
                try:
                    owed = object.__getattribute__(self, "_owed")
                except AttributeError:
                    owed = None
                ledger = owed() if owed is not None else None
                if ledger is not None and not ledger.paying:
                    ledger.pay()
                    return object.__getattribute__(self, name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def axes(self) -> tuple[str | None, ...]:
        """The names users read, one per axis (None where only the size is known)."""
        now = _dims.epoch()
        if self._names is None or self._epoch != now:
            self._names = _dims.names_of(self.dims, self.tags)
            self._epoch = now
        return self._names

    @property
    def shown_axes(self) -> tuple[str | None, ...]:
        """The names tables and messages show, one per axis: `axes`, with a conventional
        batch that structure shows is something else (a graph's nodes) called that."""
        return _shown.shown_names(self.dims, self.axes)

    def tag(self, i: int) -> str | None:
        return self.tags[i] if i < len(self.tags) else None


# Roles only data flow gives: a query-key product, its softmax, attention's output.
_FLOW_ROLES = frozenset({"scores", "attn", "context"})


# Names too generic to override what data flow carried (`output = x.reshape(...)` inside
# a helper such as repeat_kv still holds K).
_WEAK_NAME_ROLES = frozenset({"context", "out"})


def role_for(label: str | None, flow: str | None) -> str | None:
    """What data flow says of attention's own tensors; else a name that says Q, K, V or
    mask; else the role flow carried along (a transpose of Q is Q); else a generic name."""
    if flow in _FLOW_ROLES:
        return flow
    role = canonical_role(label)
    if role in _NAME_ROLES and (flow is None or role not in _WEAK_NAME_ROLES):
        return role
    return flow


def buffer_origin(
    keeps_value: bool, slices: bool, in_tensors: list, in_metas: list, modules: list
) -> tuple[str, bool]:
    """(buffer name, sliced) for an op's output: read straight from a module buffer, or
    from a tensor that was, through ops that keep the buffer's values."""
    # Only single-tensor ops: `mask * scores` is no longer the mask.
    if not keeps_value or len(in_tensors) != 1:
        return "", False
    meta = in_metas[0]
    if meta is not None and meta.buffer:
        return meta.buffer, meta.sliced or slices
    if meta is not None and meta.op:
        return "", False  # made by a traced op, so not a buffer
    name = buffer_name(in_tensors[0], modules)
    return (name, slices) if name else ("", False)


def buffer_name(tensor, modules: list) -> str:
    for module in reversed(modules):
        for name, buf in getattr(module, "_buffers", {}).items():
            if buf is tensor:
                return name
    return ""


_SWEEP_AT = 4096  # entries a table holds before its first sweep
_Tensor = torch.Tensor


class TensorTable:
    """Metas by live tensor, holding no tensor: `id(tensor) -> (weak reference, meta)`.

    torch's `WeakTensorKeyDictionary` builds a `WeakIdRef` on every lookup (1.5 us); a
    plain dict keyed by id, checked against the weak reference, costs a dict lookup. A new
    tensor that reuses the id never reads the old entry (the reference is dead). Entries
    of collected tensors are swept when the table has doubled since the last sweep, and
    when a forward ends (`ModuleStack.exit_module`), not by a callback per reference: a
    callback costs more than the entry, and one that held the dict made each entry a
    reference cycle."""

    __slots__ = ("_data", "_limit", "__weakref__")

    def __init__(self) -> None:
        self._data: dict[int, tuple] = {}
        self._limit = _SWEEP_AT

    @property
    def lookup(self):
        """The table's own `dict.get`: `id(tensor) -> (weak reference, meta)`, or None; the
        caller checks the reference (`entry[0]() is tensor`). One C call per lookup, for
        the replay's comparison of a step's inputs (`_replay_match.matcher`)."""
        return self._data.get

    def get(self, tensor, default=None):
        entry = self._data.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        return default

    def __contains__(self, tensor) -> bool:
        return self.get(tensor) is not None

    def __setitem__(self, tensor, meta) -> None:
        if not isinstance(tensor, _Tensor):
            # Only tensors have metas: a NumPy scalar or array, a number, an fx Proxy is
            # not stored (a NumPy scalar cannot even be weakly referenced).
            return
        data = self._data
        data[id(tensor)] = (_weakref.ref(tensor), meta)
        if len(data) > self._limit:
            self.sweep()

    def sweep(self) -> None:
        """Drop the entries of collected tensors."""
        data = self._data
        for key in [k for k, entry in data.items() if entry[0]() is None]:
            del data[key]
        self._limit = max(_SWEEP_AT, 2 * len(data))

    def discard(self, tensor) -> None:
        entry = self._data.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            del self._data[id(tensor)]

    def __len__(self) -> int:
        self.sweep()
        return len(self._data)

    def empty(self) -> bool:
        """Whether nothing was ever stored since the last sweep (no sweep: a test on a
        hot path, where a dead entry only makes a caller look further)."""
        return not self._data
