"""Axis provenance: every axis of a traced tensor is a list of factors of dims.

A `Dim` is one axis identity, made where an axis first appears: a model input's
axis, a Linear's output features, an arange, a broadcast copy. An axis of a
tensor is a tuple of *atoms* `(dim, stride, size)`, outermost first: the atom
is the digit `(i // stride) % size` of an index `i` along the dim. A view that
splits `d_model` into `[heads, d_k]` gives two atoms of one dim; merging them
back gives the dim whole again; a reshape that cuts across atoms that are not
factors of one another entangles them (`regroup` returns None).

Two axes that an elementwise op lines up are one axis: their dims are unified
(union-find). Names and kinds (batch, token, feature, copy) are claimed by the
evidence that sees them, with a rank; stronger evidence wins, and a kind known
from a parameter or from structure is never overwritten by a different one.
Sizes never decide identity: coincident sizes change nothing here.
"""

from collections.abc import Sequence
from contextvars import ContextVar, Token
from operator import attrgetter
from typing import Any, NamedTuple

# Ranks of evidence, weakest first.
GUESS = 1  # a size equal to a known one, where nothing else is known (names only)
DECLARED = 2  # a size a module declares in an attribute (d_model, n_heads, head_dim)
CONVENTION = 3  # the usual layout of a model's input (token ids are [batch, seq])
PARAM = 4  # a parameter's role (a Linear's output features)
STRUCTURE = 5  # what an op does with the axis (attention runs along seq_k)
CONTRACT = 6  # the user's own annotation

# Kinds: what the elements along an axis are.
BATCH = "batch"  # separate examples
TOKEN = "token"  # positions of a sequence, or of an image grid
FEATURE = "feature"  # features of one position (d_model, heads x d_k, channels)
COPY = "copy"  # a broadcast copy: every element along it is the same

Atom = tuple["Dim", int, int]
Axis = tuple[Atom, ...]

# Bumped whenever a name or kind changes, so cached display names know they are stale.
_epoch = [0]
# Every Dim gets the next serial: a session that records its ops (`_trace.replay`) tells the dims an
# op made (a serial above the one before the op) from the ones it was given.
_serial = [0]
# While a step is recorded (`watch`): the roots a claim or a unification changed, in the
# recording's own context (a thread, a task), never another's. None otherwise.
_touched: ContextVar[list | None] = ContextVar("shapeguard_touched", default=None)


def watch() -> tuple[list, Token]:
    """Note from now on, in this context, every root a claim or a unification changes, in
    the list returned (`_replay_effects.Capture`, recording a step); `unwatch(token)` stops."""
    touched: list = []
    return touched, _touched.set(touched)


def unwatch(token: Token) -> None:
    """Stop the noting `watch` started (the watch it was started inside goes on)."""
    _touched.reset(token)


def names_changed() -> None:
    """Tell the cached display names that a name or kind changed (a replay restoring dims'
    states: `restore`)."""
    _epoch[0] += 1


def epoch() -> int:
    return _epoch[0]


def serial() -> int:
    return _serial[0]


def set_side(root: "Dim", *, q: bool = False, k: bool = False) -> None:
    """Mark a root as the rows (q) or the columns (k) of a query-key product."""
    touched = _touched.get()
    if touched is not None:
        touched.append(root)
    if q:
        root.q_side = True
    if k:
        root.k_side = True


class Dim:
    """One axis identity (a union-find node). Read its facts through `find()`."""

    __slots__ = (
        "size",
        "parent",
        "name",
        "rank",
        "kind",
        "kind_rank",
        "parts",
        "q_side",
        "k_side",
        "alias",
        "origin",
        "cut",
        "joined",
        "shown",
        "serial",
        "param",
    )

    def __init__(
        self,
        size: int,
        *,
        name: str | None = None,
        rank: int = 0,
        kind: str | None = None,
        kind_rank: int = 0,
        origin: str = "",
    ) -> None:
        self.size = size
        self.parent: Dim | None = None
        self.name = name
        self.rank = rank if name else 0
        self.kind = kind
        self.kind_rank = kind_rank if kind else 0
        # Names of factors: {(stride, size): (name, rank)}, e.g. the heads and d_k of a
        # projection's output features.
        self.parts: dict[tuple[int, int], tuple[str, int]] | None = None
        self.q_side = False  # rows of a query-key product (queries)
        self.k_side = False  # columns of a query-key product (keys)
        # An atom of another dim this one lines up with (a rotary table's last axis with
        # q's d_k): only for naming, never for identity.
        self.alias: Atom | None = None
        self.origin = origin
        # Where a slice, a split or an index cut this dim from: (the atom it cut, the
        # positions of that atom it kept), so a head layout can be read back to the rows
        # of the projection it came from.
        self.cut: tuple[Atom, Sequence[int]] | None = None
        # The axes a concatenation joined into this dim, in order (a cache's keys and the
        # new ones), so the positions each part holds can be read back (`_reach/steps.py`).
        self.joined: tuple[Axis, ...] | None = None
        # A parameter's own axis, or one lined up with it, as "axis 0 of <its name>": its
        # size is fixed when the model is built, so it never holds the examples of a batch
        # (a copy made of it may). "" for any other axis.
        self.param = ""
        # How tables and messages show an axis the convention named, where structure shows
        # it is something else ("nodes": `_names/shown.py`); never read by a rule.
        self.shown: str | None = None
        _serial[0] += 1
        self.serial = _serial[0]

    def find(self) -> "Dim":
        root = self
        while root.parent is not None:
            root = root.parent
        node = self
        while node.parent is not None and node.parent is not root:
            node.parent, node = root, node.parent
        return root

    def __repr__(self) -> str:
        root = self.find()
        return f"Dim({root.size}, {root.name or '?'}, {root.kind or '?'}, {root.origin!r})"


class DimState(NamedTuple):
    """What a root dim knows of its axis besides its size and identity: one record, read
    and restored whole (a replay snapshots it before a step and makes it after). A field
    added to `Dim` that a claim changes belongs here."""

    name: str | None
    rank: int
    kind: str | None
    kind_rank: int
    parts: tuple | None  # `Dim.parts` as items: the dict itself changes in place
    q_side: bool
    k_side: bool
    # `Dim.alias`, an atom; in a recorded step, where the replay finds the atom's dim.
    alias: Any
    origin: str
    param: str
    shown: str | None


_read_state = attrgetter(*DimState._fields)


def state_of(dim: Dim) -> DimState:
    """The facts of `dim` (read from it, not from its root)."""
    state = DimState._make(_read_state(dim))
    parts = dim.parts
    return state if parts is None else state._replace(parts=tuple(parts.items()))


def restore(dim: Dim, state: DimState) -> None:
    """Give `dim` the facts `state_of` read (what changes no name: the caller bumps the
    epoch once for all it restores)."""
    for field, value in zip(DimState._fields, state, strict=True):
        setattr(dim, field, value)
    dim.parts = dict(state.parts) if state.parts is not None else None


# -- claims ---------------------------------------------------------------------------------
def claim_name(dim: Dim, name: str, rank: int) -> None:
    root = dim.find()
    if rank > root.rank:
        touched = _touched.get()
        if touched is not None:
            touched.append(root)
        root.name, root.rank = name, rank
        _epoch[0] += 1


def show_as(dim: Dim, name: str) -> None:
    """Show `dim` as `name` in tables and messages (`_names/shown.py`); names no axis."""
    root = dim.find()
    if root.shown != name:
        touched = _touched.get()
        if touched is not None:
            touched.append(root)
        root.shown = name


def claim_kind(dim: Dim, kind: str, rank: int) -> bool:
    """Give `dim` a kind; a different kind known from a parameter or from structure
    stays (the conflict is for a checker to report, never to be papered over)."""
    root = dim.find()
    if root.kind == kind:
        if rank > root.kind_rank:
            touched = _touched.get()
            if touched is not None:
                touched.append(root)
            root.kind_rank = rank
        return True
    if root.kind is not None and root.kind_rank >= PARAM:
        return False
    if rank > root.kind_rank:
        touched = _touched.get()
        if touched is not None:
            touched.append(root)
        if root.kind is not None and root.rank <= CONVENTION:
            root.name, root.rank = None, 0  # the name went with the kind it had
        root.kind, root.kind_rank = kind, rank
        _epoch[0] += 1
        return True
    return False


def accepts_kind(dim: Dim, kind: str, rank: int) -> bool:
    """Whether `claim_kind(dim, kind, rank)` would take (or already has) the kind: to claim
    an axis of several factors all or nothing."""
    root = dim.find()
    if root.kind == kind:
        return True
    if root.kind is not None and root.kind_rank >= PARAM:
        return False
    return rank > root.kind_rank


def claim_part(atom: Atom, name: str, rank: int) -> None:
    """Name the factor `atom` of its dim (the dim itself, when the atom is whole)."""
    dim, stride, size = atom
    root = dim.find()
    if stride == 1 and size == root.size:
        claim_name(root, name, rank)
        return
    parts = root.parts
    if parts is None:
        touched = _touched.get()
        if touched is not None:
            touched.append(root)
        parts = root.parts = {}
    key = (stride, size)
    if rank > parts.get(key, ("", 0))[1]:
        touched = _touched.get()
        if touched is not None:
            touched.append(root)
        parts[key] = (name, rank)
        _epoch[0] += 1


def claim_atoms(axis: Axis, kind: str, rank: int, name: str | None = None) -> None:
    for atom in axis:
        claim_kind(atom[0], kind, rank)
    if name is not None and len(axis) == 1:
        claim_part(axis[0], name, rank)


def unify(a: Dim, b: Dim) -> None:
    """`a` and `b` are one axis. Equal sizes only (a size-1 axis broadcasts instead)."""
    a, b = a.find(), b.find()
    if a is b or a.size != b.size:
        return
    touched = _touched.get()
    if touched is not None:
        touched.append(a)
        touched.append(b)
    # The name of the better-known side wins; a tie goes to the side whose kind is better
    # known (a mask's conventional "batch" never renames the scores' sequence axis).
    if a.kind == COPY and b.kind not in (None, COPY):
        a, b = b, a  # a broadcast copy lined up with a real axis is that axis: keep the real one
    if b.rank > a.rank or (b.rank == a.rank and b.kind_rank > a.kind_rank):
        a.name, a.rank = b.name, b.rank
    if b.kind is not None and b.kind != COPY and (a.kind is None or b.kind_rank > a.kind_rank):
        a.kind, a.kind_rank = b.kind, b.kind_rank
    if b.parts:
        parts = a.parts if a.parts is not None else {}
        for key, (name, rank) in b.parts.items():
            if rank > parts.get(key, ("", 0))[1]:
                parts[key] = (name, rank)
        a.parts = parts
    a.q_side = a.q_side or b.q_side
    a.k_side = a.k_side or b.k_side
    a.param = a.param or b.param
    if a.alias is None:
        a.alias = b.alias
    if a.cut is None:
        a.cut = b.cut
    if a.joined is None:
        a.joined = b.joined
    if a.shown is None:
        a.shown = b.shown
    b.parent = a
    _epoch[0] += 1


def line_up(x: Axis, y: Axis) -> None:
    """Two axes an elementwise op lines up (both longer than 1): one identity."""
    if len(x) == 1 and len(y) == 1:
        (dx, sx, nx), (dy, sy, ny) = x[0], y[0]
        rx, ry = dx.find(), dy.find()
        x_whole, y_whole = sx == 1 and nx == rx.size, sy == 1 and ny == ry.size
        if x_whole and y_whole:
            unify(rx, ry)
            return
        # A whole dim of its own (a rotary table, a bias, a cache) lined up with a factor
        # of another: it reads as that factor, and is of its kind.
        if x_whole and not y_whole and _anonymous(rx) and _agrees(rx, y[0]):
            _alias(rx, y[0])
        elif y_whole and not x_whole and _anonymous(ry) and _agrees(ry, x[0]):
            _alias(ry, x[0])


def _alias(root: Dim, atom: Atom) -> None:
    touched = _touched.get()
    if touched is not None:
        touched.append(root)
    root.alias = atom
    other = atom[0].find()
    if other.kind is not None and other.kind_rank >= PARAM:
        claim_kind(root, other.kind, other.kind_rank)
    _epoch[0] += 1


def _anonymous(root: Dim) -> bool:
    return root.alias is None and root.rank < PARAM and root.kind_rank < PARAM


def _agrees(root: Dim, atom: Atom) -> bool:
    """A whole dim and a factor it lines up with say the same of what the axis is: a dim
    whose usual layout makes it the batch (a model input's) is no table to read as a factor
    of features, whatever made those (a fold of batch and heads an unknown op made anew)."""
    other = atom[0].find()
    return root.kind is None or other.kind in (None, COPY, root.kind)


# -- axes ---------------------------------------------------------------------------------
def whole(dim: Dim) -> Axis:
    return ((dim, 1, dim.size),) if dim.size != 1 else ()


def fresh(size: int, **facts) -> Axis:
    """The axis of a new dim of `size` (size 1 has no atoms: it carries nothing)."""
    return whole(Dim(size, **facts)) if size != 1 else ()


def fresh_axes(shape: Sequence[int], origin: str = "") -> tuple[Axis, ...]:
    return tuple(fresh(int(s), origin=origin) for s in shape)


def size_of(axis: Axis) -> int:
    total = 1
    for _, _, n in axis:
        total *= n
    return total


def is_whole(atom: Atom) -> bool:
    dim, stride, size = atom
    return stride == 1 and size == dim.find().size


def normalize(atoms: Sequence[Atom]) -> Axis:
    """Roots resolved, size-1 atoms dropped, adjacent factors of one dim merged."""
    out: list[Atom] = []
    for dim, stride, size in atoms:
        if size == 1:
            continue
        root = dim.find()
        if out:
            d0, s0, n0 = out[-1]
            if d0 is root and s0 == stride * size:
                out[-1] = (root, stride, size * n0)
                continue
        out.append((root, stride, size))
    return tuple(out)


def regroup(src: Sequence[Axis], dst_sizes: Sequence[int]) -> list[Axis] | None:
    """The axes of a view from `src` to `dst_sizes` (equal element counts): the flat
    factors of the source, cut from the innermost out at each target size. None
    when a cut falls inside a factor that it does not divide: the view entangles
    them, and no target axis is a factor of a source one."""
    atoms = [atom for axis in src for atom in normalize(axis)]
    out: list[Axis] = []
    for size in reversed(dst_sizes):
        need = int(size)
        got: list[Atom] = []
        while need > 1:
            if not atoms:
                return None
            dim, stride, n = atoms.pop()
            if need % n == 0:
                got.append((dim, stride, n))
                need //= n
            elif n % need == 0:
                got.append((dim, stride, need))
                atoms.append((dim, stride * need, n // need))
                need = 1
            else:
                return None
        out.append(normalize(tuple(reversed(got))))
    if atoms:
        return None
    out.reverse()
    return out


def kind_of(axis: Axis) -> str | None:
    """The kind of an axis: its atoms' common kind; "mixed" when they differ."""
    kinds = {atom[0].find().kind for atom in axis}
    if not kinds:
        return None
    if len(kinds) == 1:
        return kinds.pop()
    kinds.discard(None)
    kinds.discard(COPY)
    if len(kinds) == 1:
        return kinds.pop()
    return "mixed" if kinds else None


def kinds_in(axis: Axis) -> set[str]:
    return {k for atom in axis if (k := atom[0].find().kind) is not None}


def strong_kind(atom: Atom) -> str | None:
    """The atom's kind when a parameter, structure or a contract says so."""
    root = atom[0].find()
    return root.kind if root.kind_rank >= PARAM else None


def strong_kind_of(axis: Axis) -> str | None:
    """The axis's kind, when all its atoms have it on strong evidence (not a convention)."""
    kinds = {strong_kind(atom) for atom in axis}
    return kinds.pop() if len(kinds) == 1 else None


def copy_of(copy: Axis, axis: Axis) -> None:
    """A broadcast copy whose count the user read from `axis` (`x.repeat(bsz, 1, 1)` after
    `bsz, T, _ = h.size()`): the copy stands for that axis in what the user's names say
    (`stands_for`), for naming only; its identity and kind stay a copy's."""
    if len(copy) != 1 or len(axis) != 1 or copy[0][2] != axis[0][2]:
        return
    root = copy[0][0].find()
    if root.kind != COPY or root.alias is not None:
        return
    touched = _touched.get()
    if touched is not None:
        touched.append(root)
    root.alias = axis[0]
    _epoch[0] += 1


def stands_for(atom: Atom) -> Atom:
    """The atom an atom stands for in the user's names: itself, or for a copy counted from
    an axis the user read (`copy_of`), that axis's atom."""
    root = atom[0].find()
    if root.kind == COPY and root.alias is not None:
        return normalize((root.alias,))[0]
    return (root, atom[1], atom[2])


def established_kind(atom: Atom) -> str | None:
    """`strong_kind`, unless the evidence disagrees with itself: a dim cut from an axis
    whose own kind is established as another (a slice of a projection's features that
    attention then runs along as its rows: grouped heads packed as queries) is established
    as neither."""
    root = atom[0].find()
    kind = root.kind if root.kind_rank >= PARAM else None
    for _ in range(4):
        if kind is None or root.cut is None:
            return kind
        source = root.cut[0][0].find()
        if source.kind_rank >= PARAM and source.kind not in (kind, COPY):
            return None
        root = source
    return kind


def is_factor(axis: Axis) -> bool:
    """One factor of a dim, not the dim whole (the heads or d_k of a head split)."""
    return len(axis) == 1 and not is_whole(axis[0])


def roots_of(axis: Axis) -> list[Dim]:
    return [atom[0].find() for atom in axis]


# -- names --------------------------------------------------------------------------------
# The kind each name stands for: a name is never shown against the kind structure gives.
NAME_KINDS = {
    "batch": BATCH,
    "seq": TOKEN,
    "height": TOKEN,
    "width": TOKEN,
    "depth": TOKEN,
    "d_model": FEATURE,
    "channels": FEATURE,
    "d_k": FEATURE,
    "heads": FEATURE,
    "kv_heads": FEATURE,
}


def _fits(name: str | None, kind: str | None) -> bool:
    return name is None or kind is None or NAME_KINDS.get(name, kind) == kind


def dim_name(root: Dim, _depth: int = 0) -> str | None:
    name = root.name if _fits(root.name, root.kind) else None
    if name is None and root.alias is not None and _depth < 4:
        name = atom_name(root.alias, _depth + 1)
    if name == "seq":
        if root.q_side and not root.k_side:
            return "seq_q"
        if root.k_side and not root.q_side:
            return "seq_k"
    return name


def atom_name(atom: Atom, _depth: int = 0) -> str | None:
    dim, stride, size = atom
    root = dim.find()
    if stride == 1 and size == root.size:
        return dim_name(root, _depth)
    if root.parts:
        part = root.parts.get((stride, size))
        if part is not None and _fits(part[0], root.kind):
            return part[0]
    return None


def known_name(axis: Axis, tag: str | None = None) -> str | None:
    """The name users read for an axis (None: shown by its size alone)."""
    if not axis:
        return None
    name = atom_name(axis[0]) if len(axis) == 1 else _composite_name(axis)
    if tag and name in ("seq", "seq_q", "seq_k"):
        return f"seq_{tag}"
    return name


def _composite_name(axis: Axis) -> str | None:
    roots = roots_of(axis)
    first = roots[0]
    if all(r is first for r in roots) and size_of(axis) == first.size:
        return dim_name(first)  # the factors of one dim, merged back whole
    real = [a for a in axis if a[0].find().kind != COPY]
    if len(real) == 1 and len(real) < len(axis) and atom_name(real[0]) in ("kv_heads", "heads"):
        return "heads"  # kv heads repeated for grouped-query attention are query heads
    names = [atom_name(a) for a in axis]
    known = [n for n in names if n]
    if len(known) == len(names) and len(set(known)) == len(known):
        return "*".join(known)  # heads*d_k, batch*heads
    return None


def names_of(axes: Sequence[Axis], tags: Sequence[str | None] = ()) -> tuple[str | None, ...]:
    if not tags:
        return tuple(known_name(a) for a in axes)
    return tuple(known_name(a, t) for a, t in zip(axes, tags, strict=False))


def describe_atom(atom: Atom) -> str:
    """A factor in a message: its name, or where its dim came from."""
    name = atom_name(atom)
    if name:
        return name
    root = atom[0].find()
    return root.origin or "an axis"
