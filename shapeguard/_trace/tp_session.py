"""Tensor parallelism on the session's side: a DTensor's record and local axes, the
ops torch.distributed runs itself (`plumbing`) and what they say of a plain tensor
(replicated by a collective; a reduce-scatter's piece, split along which axis, and a
gather of one), and each module's sharding read once per session (`sharding`, `owner`,
`local_sizes`). What a rule needs of tensor parallelism
(reading placements and a module's split from its DTensor weights) is `_tp`, below the
checks; this module sits with the session, whose state it reads and writes.

The session holds all of it in one member, `session.tp` (a `SessionTP`): the session asks
it, and the tp rules read it as `call.tp` (`checks.TPView`); no other rule sees it.

Long because every session-side branch for tensor parallelism is here, so that
the session itself has one seam for it; split, it would spread into the session again.
"""

import dataclasses
import weakref
from dataclasses import dataclass

import torch

from .. import _ops
from .._names import axes as _axes
from .._names import flow as _flow
from .._tp import (
    Sharding,
    describe,
    dtensor_class,
    is_dtensor,
    is_fsdp_managed,
    local_shape,
    mesh_dims,
    placement_name,
    read_sharding,
)


def record_sharding(t, meta=None, session=None):
    """(placements, mesh dims, local shape, local numel) for the trace's record of a
    DTensor made by an op; its local shard gets the DTensor's axes (`link_local`) in
    `session` (the current one: the session passes itself, so this module never imports
    it)."""
    if not is_dtensor(t):
        return None
    if meta is not None and session is not None:
        link_local(session, t, meta)
        if any(type(p).__name__ == "Partial" for p in t.placements):
            # The all_reduce that makes it Replicate runs in torch.distributed, on this
            # shard, after the module's op: what it reduces is told from here.
            module = session.module_stack[-1] if session.module_stack else None
            path = session.module_path(module) if module is not None else ""
            session.tp.state().partials[t._local_tensor] = (path, meta.axes, meta.dims)
    local = local_shape(t)
    numel = 1
    for s in local:
        numel *= s
    placements = tuple(placement_name(p) for p in t.placements)
    return placements, tuple(mesh_dims(t.device_mesh)), local, numel


_VIEW_AS = _ops.by_name("view_as")
_SPLITS = (_ops.by_name("chunk"), _ops.by_name("split"))  # how redistribute cuts a gather


@dataclass(frozen=True, slots=True)
class Replicated:
    """A plain tensor every rank of a process group holds whole: the collective that made
    it and the module it ran in."""

    group: str  # the process group's name
    collective: str  # all_reduce, all_gather_into_tensor
    module: str  # the module path it ran in ("" at the top)
    axes: tuple | None = None  # the names of its axes, when the reduced DTensor had them
    shape: tuple = ()  # its shape, as the collective gave it
    tiled: "Replicated | None" = None  # a gather of this replicated tensor: tp copies of it


def plumbing(session, func, spec, args, kwargs):
    """Run an op torch.distributed called itself (DTensor.from_local and to_local,
    redistribute, collectives, FSDP's unshard): never checked, never recorded. The
    `view_as` that from_local and to_local make of a tensor keeps its axes, so a shard
    and the tensor it came from are one tensor to the names."""
    out = func(*args, **kwargs)
    _mark_replicated(session, func, args, out)
    _mark_split(session, func, args, kwargs, out)
    if spec is _VIEW_AS and args and out is not args[0]:
        source = args[0]
        meta = session.metas.get(source)
        if meta is not None and getattr(out, "shape", None) == getattr(source, "shape", ()):
            session.metas[out] = meta
    return out


# The collectives whose output every rank of the group holds whole and equal: what
# redistribute runs to make a DTensor Replicate (Partial -> all_reduce, Shard -> all_gather).
_REPLICATING = ("all_reduce", "all_gather_into_tensor", "all_gather_tensor", "all_gather")


def _mark_replicated(session, func, args, out) -> None:
    """Remember which plain tensors torch.distributed made replicated across a process
    group, so a later `from_local(t, [Shard(d)])` of one (a plan declaring it this rank's
    shard) is seen for what it is (`replicated`). A collective's output is replicated by
    what the collective is; the plumbing that passes it on unchanged in shape
    (`wait_tensor`, the autograd wrapper, `to_local`'s and `from_local`'s `view_as`) keeps
    the mark."""
    if not args:
        return
    name = getattr(func, "__name__", "")
    state = session.tp.state()
    if _ops.declared(name) in _SPLITS and isinstance(out, tuple | list):
        # An all_gather stacks along dim 0; redistribute then chunks that and cats the
        # pieces along the shard dim: the whole cat is the gather, moved.
        found = state.replicated.get(args[0])
        if found is not None:
            for i, piece in enumerate(out):
                state.pieces[piece] = (found, i, len(out))
        return
    if name == "cat" and isinstance(args[0], tuple | list) and isinstance(out, torch.Tensor):
        parts = [state.pieces.get(t) for t in args[0]]
        first = parts[0] if parts else None
        if first is not None and all(
            q is not None and q[0] is first[0] and q[1] == i and q[2] == len(parts)
            for i, q in enumerate(parts)
        ):
            state.replicated[out] = first[0]
        return
    if not isinstance(out, torch.Tensor) or is_dtensor(out):
        return
    if name in _REPLICATING:
        group = next((a for a in args[1:] if isinstance(a, str) and a not in _REDUCE_OPS), None)
        if group is None:
            return
        shape = tuple(int(n) for n in out.shape)
        partial = state.partials.get(args[0])
        if partial is not None:
            path, axes = partial[:2]
        else:
            module = session.module_stack[-1] if session.module_stack else None
            path, axes = (session.module_path(module) if module is not None else ""), None
        before = state.replicated.get(args[0])
        if before is not None and before.group == group and name != "all_reduce":
            # Gathering what every rank already holds whole stacks tp equal copies.
            state.replicated[out] = Replicated(group, name, path, before.axes, shape, before)
            return
        state.replicated[out] = Replicated(group, name, path, axes, shape)
        return
    source = args[0]
    if not isinstance(source, torch.Tensor) or tuple(source.shape) != tuple(out.shape):
        return
    found = state.replicated.get(source)
    if found is not None:
        state.replicated[out] = found


_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")


@dataclass(frozen=True, slots=True)
class Split:
    """A plain tensor that is this rank's piece of a reduce-scatter over a process group:
    split along `dim` of the layout the reduced tensor had in the user's code (DTensor's
    plumbing moves that axis to dim 0 for the collective, `_mark_split`)."""

    group: str  # the process group's name
    dim: int  # the axis the scatter split, in the user's layout
    ndim: int
    module: str  # the module the reduced (Partial) tensor was made in ("" when unknown)
    axes: tuple | None = None  # the names of its axes, when the reduced DTensor had them
    whole: int | None = None  # the size of `dim` before the scatter
    taken: str | None = None  # the module whose plan took it back as a DTensor (from_local)
    moved: tuple = ()  # after the user's transposes: axis i was the scatter's axis moved[i]

    def at_scatter(self, d: int) -> int:
        """Axis `d` in the layout the scatter ran in (the producer's plan names that)."""
        return self.moved[d] if self.moved else d


@dataclass(frozen=True, slots=True)
class Gathered:
    """An all_gather of a `Split` tensor over its group, along `dim` of the same layout."""

    split: Split
    dim: int
    module: str  # the module it ran in ("" at the top)
    local: tuple = ()  # the shape of the piece gathered
    shape: tuple = ()  # the gather's shape (a transpose of it, read later, keeps the mark)


class _Cut:
    """One `chunk(t, n, dim)` in torch.distributed's plumbing, shared by its pieces: what
    `t` carried, so the `cat` that puts the pieces back (the same dim: padding an uneven
    split) or lays them out along dim 0 (a collective's copy) is told from its arguments."""

    __slots__ = ("dim", "n", "size", "origin", "split", "gathered")

    def __init__(self, dim, n, size, origin, split, gathered) -> None:
        self.dim, self.n, self.size = dim, n, size
        self.origin, self.split, self.gathered = origin, split, gathered


def _dim_of(args, kwargs, index: int, ndim: int) -> int | None:
    dim = kwargs.get("dim", args[index] if len(args) > index else 0)
    return dim % ndim if isinstance(dim, int) and ndim else None


def _mark_split(session, func, args, kwargs, out) -> None:
    """Follow the axis a reduce-scatter split through DTensor's plumbing (arguments, never
    sizes): `Partial -> Shard(d)` chunks the reduced shard along d and cats the pieces
    along dim 0 (`funcol.reduce_scatter_tensor`), so the collective's output is this
    rank's 1/tp of axis d (`Split`); a gather of it (`Gathered`) chunks along dim 0 and
    cats along the dim it gathers. A gather along another axis than d follows a
    `from_local(t, [Shard(k)])` that contradicts the split (read by `gathered`)."""
    if not args:
        return
    name = getattr(func, "__name__", "")
    state = session.tp.state()
    source = args[0]
    if name == "chunk" and isinstance(out, tuple | list) and isinstance(source, torch.Tensor):
        dim = _dim_of(args, kwargs, 2, source.dim())
        if dim is not None:
            size = state.unpadded.get(source) or int(source.shape[dim])
            cut = _Cut(
                dim, len(out), size, _origin(state, source),
                state.split.get(source), state.gathered.get(source),
            )  # fmt: skip
            for i, piece in enumerate(out):
                state.cuts[piece] = (cut, i)
        return
    # A piece copied as it is (contiguous, a cast) or padded at its end (F.pad: the last
    # piece of an uneven split) is still that piece.
    spec = _ops.lookup(name)
    copied = spec.family == _ops.SAME and spec.keeps_value
    if (copied or name == "pad") and isinstance(out, torch.Tensor):
        found = state.cuts.get(source)
        if found is not None:
            state.cuts[out] = found
    if (
        name == "cat"
        and isinstance(source, tuple | list)
        and source
        and isinstance(out, torch.Tensor)
    ):
        parts = [state.cuts.get(t) for t in source]
        first = parts[0]
        if first is None or len(parts) != first[0].n:
            return
        joined: _Cut = first[0]
        if not all(q is not None and q[0] is joined and q[1] == i for i, q in enumerate(parts)):
            return
        _join(state, joined, _dim_of(args, kwargs, 1, out.dim()), out)
        return
    if not isinstance(out, torch.Tensor) or is_dtensor(out):
        return
    if name == "reduce_scatter_tensor" and len(args) == 4 and args[1] in _REDUCE_OPS:
        # _c10d_functional.reduce_scatter_tensor(input, op, group_size, group): it scatters
        # dim 0; funcol moves another scatter dim there with a chunk and a cat first.
        group = args[3]
        if not isinstance(group, str) or not isinstance(source, torch.Tensor):
            return
        moved = state.moved.get(source)
        if moved is not None:
            dim, whole, origin = moved
        else:
            # Dim 0 as it is, said only of a Partial's own shard (or its padded copy): a
            # cat not seen for what it is (narrow under tracing) is no claim.
            dim, whole, origin = 0, int(source.shape[0]), _origin(state, source)
            if origin is None:
                return
        # The module is popped by then (RowwiseParallel scatters in its output hook): the
        # Partial's record names it.
        path, axes = _strong_names(origin) if origin is not None else ("", None)
        state.split[out] = Split(group, dim, source.dim(), path, axes, whole)
        session.tp.split = True
        return
    if name in ("all_gather_into_tensor", "all_gather_tensor"):
        split = state.split.get(source)
        group = next((a for a in args[1:] if isinstance(a, str)), None)
        if split is not None and group == split.group:
            module = session.module_stack[-1] if session.module_stack else None
            path = session.module_path(module) if module is not None else ""
            local = tuple(int(n) for n in source.shape)
            shape = tuple(int(n) for n in out.shape)
            state.gathered[out] = Gathered(split, 0, path, local, shape)
        return
    if not isinstance(source, torch.Tensor):
        return
    split = state.split.get(source)
    if name == "narrow" and split is not None:  # unpadding this rank's piece
        if _dim_of(args, kwargs, 1, source.dim()) == split.dim:
            state.split[out] = split
        return
    if tuple(source.shape) != tuple(out.shape):
        return
    if split is not None:
        if name == "view_as" and session.module_stack:
            # from_local's view, in the pre-hook of the module whose plan declares it (the
            # last view before a read; to_local's runs after its module has left).
            taken = session.module_path(session.module_stack[-1])
            split = dataclasses.replace(split, taken=taken)
        state.split[out] = split
    gathered = state.gathered.get(source)
    if gathered is not None:
        state.gathered[out] = gathered


_CARRYING = (_ops.SAME, _ops.BINARY)


def carry(session, call, tensors, outputs) -> None:
    """The user's ops that keep the layout (elementwise: the residual add of a
    sequence-parallel block, dropout, a cast, a norm over features) or permute it (a
    transpose to [seq, batch, d]) carry their operand's marks: a reduce-scatter's piece
    stays split along that axis, wherever it moved, and a gather of one stays that gather;
    a DTensor's shard the same, where the placements allow. Elementwise operands must
    agree. Any other op (a view, a product) ends the marks: a miss, never a claim."""
    family = call.spec.family
    if family not in _CARRYING and family != _ops.LAYOUT:
        return
    state = session.tp.state()
    for table, key in ((state.split, _split_key), (state.gathered, _gathered_key)):
        marked = [
            (mark, t)
            for t in tensors
            if (mark := table.get(t._local_tensor if is_dtensor(t) else t)) is not None
        ]
        if not marked or len({key(mark) for mark, _ in marked}) > 1:
            continue  # unmarked, or operands that disagree: no claim
        found, like = marked[-1]  # `h + ffn(h)`: the sublayer's own output names it
        if family == _ops.LAYOUT:
            order = _flow.layout_order(call, like.dim())
            if order is None or len(outputs) != 1:
                continue
            found = _moved(found, order)
        for out in outputs:
            _carry_to(table, found, like, out, family == _ops.LAYOUT)


def _split_key(mark) -> tuple:
    return mark.group, mark.dim


def _gathered_key(mark) -> tuple:
    return mark.split.group, mark.split.dim, mark.dim


def _carry_to(table, mark, like, out, moved: bool) -> None:
    if not moved and tuple(out.shape) != tuple(like.shape):  # broadcast to more
        return
    if not is_dtensor(out):
        if not is_dtensor(like):
            table[out] = mark
        return
    if not is_dtensor(like):
        return
    kinds = {type(p).__name__ for p in (*out.placements, *like.placements)}
    if kinds == {"Replicate"} or (not moved and tuple(out.placements) == tuple(like.placements)):
        table[out._local_tensor] = mark


def _moved(mark, order: list[int]):
    """`mark` after a permutation of the axes (output axis i is input axis order[i]). A
    gather is told in its own layout: whether it stacked along the split axis does not
    depend on where the axes went after it."""
    if isinstance(mark, Gathered):
        return mark
    axes = tuple(mark.axes[i] for i in order) if mark.axes else mark.axes
    moved = tuple(mark.at_scatter(i) for i in order)
    return dataclasses.replace(mark, dim=order.index(mark.dim), axes=axes, moved=moved)


def _join(state, cut: _Cut, dim: int | None, out) -> None:
    """A `cat` of all of `cut`'s pieces, in order, along `dim`."""
    if dim == cut.dim:  # put back as it was (padded)
        state.unpadded[out] = cut.size
        if cut.origin is not None:
            state.origins[out] = cut.origin
        if cut.split is not None:
            state.split[out] = cut.split
        if cut.gathered is not None:
            state.gathered[out] = cut.gathered
    elif dim == 0:  # laid out along dim 0 for a reduce-scatter
        state.moved[out] = (cut.dim, cut.size, cut.origin)
    elif dim is not None and cut.dim == 0 and cut.gathered is not None:
        # An all_gather's output (stacked along dim 0) moved to the gather dim.
        g = cut.gathered
        state.gathered[out] = Gathered(g.split, dim, g.module, g.local, tuple(out.shape))


def _strong_names(origin) -> tuple:
    """(module path, axis names), a name kept only where structure, a parameter or a
    contract gave the axis its kind: a [seq, batch, d] model's input is named [batch,
    seq, d] by convention until attention runs, and a finding must not say so."""
    from .._names import dims as D

    path, axes, dims = origin
    names = tuple(
        name if name is not None and D.strong_kind_of(axis) is not None else None
        for name, axis in zip(axes, dims, strict=False)
    )
    return path, names if any(names) else None


def _origin(state, t):
    """(module path, axes, dims) of a Partial DTensor's shard, or of the copy padding made."""
    found = state.partials.get(t)
    return found if found is not None else state.origins.get(t)


def local_axes(axis, size: int):
    """The atoms of this rank's even shard of `axis` (`size` of its entries): index i of
    a chunk is digit (g // 1) % size of the global index g, the innermost factor of
    that size; None when no factor of the axis has that size (an uneven split)."""
    from .._names import dims as D

    atoms = list(D.normalize(axis))
    taken, product = [], 1
    for dim, stride, n in reversed(atoms):
        if product == size:
            break
        if product * n <= size:
            if size % (product * n):
                return None
            taken.append((dim, stride, n))
            product *= n
            continue
        part = size // product
        if size % product or n % part:
            return None
        taken.append((dim, stride, part))
        product *= part
    return tuple(reversed(taken)) if product == size else None


def link_local(session, t, meta) -> None:
    """Give a DTensor's local shard the axes of the DTensor (`to_local` then hands them
    to the user's plain tensor): shared where the placement replicates, this rank's
    factor of the axis a placement shards."""
    from .meta import TensorMeta

    local = t._local_tensor
    if session.metas.get(local) is not None:
        return
    dims = list(meta.dims)
    for p in t.placements:
        if type(p).__name__ == "Shard":
            d = p.dim % len(dims)
            part = local_axes(dims[d], int(local.shape[d]))
            if part is None:
                return
            dims[d] = part
        elif type(p).__name__ != "Replicate":
            return  # Partial: the values are not the DTensor's yet
    session.metas[local] = TensorMeta(
        tuple(dims), meta.tags, label=meta.label, role=meta.role, op=meta.op,
        rotary=meta.rotary, param=meta.param, flagged=meta.flagged, laid_out=meta.laid_out,
        normed=meta.normed, addresses=meta.addresses, normed_over=meta.normed_over,
        weighted=meta.weighted,
    )  # fmt: skip


def dtensor_meta(session, t):
    """The meta of a DTensor the session sees for the first time (from_local made it
    in torch.distributed): its local shard's axes where the placement replicates, a new
    axis where it shards; None when the shard has no axes known either, or `t` is no
    DTensor."""
    if not is_dtensor(t):
        return None
    from .._names import dims as D
    from .meta import TensorMeta

    local = session.metas.get(t._local_tensor)
    if local is None:
        return None
    dims = list(local.dims)
    mesh = mesh_dims(t.device_mesh)
    for k, p in enumerate(t.placements):
        kind = type(p).__name__
        if kind in ("Shard", "_StridedShard"):
            d = p.dim % len(dims)
            shard = dims[d]
            dims[d] = D.fresh(int(t.shape[d]), origin="a sharded axis of a DTensor")
            if kind == "Shard" and k < len(mesh):
                _name_global(session, shard, dims[d], mesh[k])
        elif kind != "Replicate":
            return None
    return TensorMeta(tuple(dims), local.tags, label=local.label, role=local.role, op=local.op)


def _name_global(session, shard, axis, mesh_dim) -> None:
    """A shard declared by `from_local` (SequenceParallel's input: this rank's slice of
    seq): the DTensor's global axis takes the shard's name, and the shard's axis is
    shown with the global size, `seq=10 (20/tp2)`, as local head axes are. Only for a
    shard that is one whole named axis: a factor of one is someone else's split."""
    from .._names import dims as D

    if len(shard) != 1 or len(axis) != 1 or not D.is_whole(shard[0]):
        return
    local, glob = shard[0][0].find(), axis[0][0].find()
    if local.name is None or glob.name is not None:
        return
    glob.name, glob.rank, glob.kind, glob.kind_rank = (
        local.name, local.rank, local.kind, local.kind_rank,
    )  # fmt: skip
    name, size = mesh_dim
    session.trace.axis_notes[(local.name, local.size)] = f"{glob.size}/{name}{size}"


# -- per-session state ---------------------------------------------------------------------------
class _State:
    __slots__ = (
        "shardings", "replicated", "partials", "pieces", "cuts", "moved", "origins", "split",
        "gathered", "unpadded",
    )  # fmt: skip

    def __init__(self) -> None:
        from .meta import TensorTable

        self.shardings: dict[int, Sharding | None] = {}
        self.replicated = TensorTable()  # plain tensor -> Replicated
        self.partials = TensorTable()  # a Partial DTensor's shard -> (module path, axes, dims)
        self.pieces = TensorTable()  # a chunk of a replicated tensor -> (Replicated, i, n)
        self.cuts = TensorTable()  # a chunk in the plumbing -> (_Cut, i)
        self.moved = TensorTable()  # a chunk-and-cat copy along dim 0 -> (dim, size, origin)
        self.origins = TensorTable()  # a padded copy of a Partial's shard -> (path, axes, dims)
        self.split = TensorTable()  # a reduce-scatter's output -> Split
        self.gathered = TensorTable()  # an all_gather of a Split tensor -> Gathered
        self.unpadded = TensorTable()  # a padded copy -> the size of its padded dim before


def sharding(session, module) -> Sharding | None:
    """`read_sharding` of `module`, once per module per session."""
    if dtensor_class() is None:
        return None
    state = session.tp.state()
    key = id(module)
    if key not in state.shardings:
        raw = _axes.declared_sizes(module)
        root = session.root
        fsdp = root is not None and is_fsdp_managed(root)
        state.shardings[key] = read_sharding(module, raw, fsdp) if raw else None
    return state.shardings[key]


def local_sizes(session, module, found: dict) -> dict:
    """The sizes a tensor-parallel module declares, with its head counts made local
    (n_heads=12 at tp=2 names the local head axis `heads=6`); its axis notes recorded
    on the trace (`heads=6 (12/tp2)`)."""
    split = sharding(session, module)  # None unless DTensor is imported
    if split is None:
        return found
    out = dict(found)
    notes = session.trace.axis_notes
    for axis in ("heads", "kv_heads"):
        count = getattr(split, axis)
        if count is None or count.local is None:
            continue
        if not count.is_local:
            out[axis] = (f"{count.attr} // tp", count.local)
        notes[(axis, count.local)] = count.note()
    trace = session.trace
    info = trace.distributed = trace.distributed if trace.distributed is not None else {}
    from .. import _ranks

    _ranks.describe(info)
    path = session.module_path(module)
    info.setdefault("modules", {})[path or type(module).__name__] = describe(split)
    return out


class SessionTP:
    """A session's tensor-parallel state, its one member for it (`session.tp`): the session
    hands it what torch.distributed runs and the DTensors it meets, and the tp rules read
    it through `call.tp` (`checks.TPView`). It holds its session weakly (a session is freed
    by reference counting alone, tests/test_no_cycles.py) and makes its tables on first use:
    a session tensor parallelism never touches pays one small object."""

    __slots__ = ("_session", "_state", "split")

    def __init__(self, session) -> None:
        self._session = weakref.ref(session)
        self._state: _State | None = None
        # Set once torch.distributed reduce-scatters a tensor: the user's elementwise ops
        # and transposes then carry the axis it split (`carry`).
        self.split = False

    def state(self) -> _State:
        found = self._state
        if found is None:
            found = self._state = _State()
        return found

    # -- what the session asks -------------------------------------------------------------------
    def plumbing(self, func, spec, args, kwargs):
        """Run an op of torch.distributed's own (`plumbing`)."""
        return plumbing(self._session(), func, spec, args, kwargs)

    def carry(self, call, tensors, outputs) -> None:
        """After each user's op: once a reduce-scatter ran, carry its marks (`carry`)."""
        if self.split:
            carry(self._session(), call, tensors, outputs)

    def dtensor_meta(self, t):
        """The meta of a DTensor first seen (`dtensor_meta`)."""
        return dtensor_meta(self._session(), t)

    def local_sizes(self, module, found: dict) -> dict:
        """The sizes `module` declares, its head counts made local (`local_sizes`)."""
        return local_sizes(self._session(), module, found)

    # -- what the tp rules read (`checks.TPView`) ------------------------------------------------
    def owner(self):
        """The innermost module on the session's stack that declares sizes, and its
        tensor-parallel split (`_tp.Sharding`, read from DTensor weights), or (None, None)."""
        session = self._session()
        if session is None:  # a rule runs inside its session: never the case
            return None, None
        for module in reversed(session.module_stack):
            if session.declared_sizes(module):
                return module, sharding(session, module)
        return None, None

    def gathered(self, tensor) -> "Gathered | None":
        """The all_gather of a reduce-scatter's piece that `tensor` (plain, or a DTensor's
        shard) is the output of (or passed on unchanged)."""
        return self.state().gathered.get(tensor)

    def any_replicated(self) -> bool:
        """Whether torch.distributed made any tensor of this session replicated (a collective
        ran): without one, `tiled` and `replicated` answer None for every tensor."""
        state = self._state
        return state is not None and not state.replicated.empty()

    def any_gathered(self) -> bool:
        """Whether a reduce-scatter's piece was gathered in this session: without one,
        `gathered` answers None for every tensor."""
        state = self._state
        return state is not None and not state.gathered.empty()

    def tiled(self, tensor) -> "Replicated | None":
        """The gather that stacked tp copies of a tensor every rank held whole, when
        `tensor` (plain, or a DTensor's shard) is its output (or passed it on unchanged)."""
        found = self.state().replicated.get(tensor)
        return found if found is not None and found.tiled is not None else None

    def replicated(self, local, mesh, mesh_dim: int) -> "Replicated | None":
        """How `local` (a plain tensor, a DTensor's shard) came to be replicated over mesh
        dim `mesh_dim` of `mesh`, by a collective torch.distributed ran; None when nothing
        says so."""
        found = self.state().replicated.get(local)
        if found is None:
            return None
        try:
            group = mesh.get_group(mesh_dim).group_name
        except Exception:  # a mesh without process groups (none on this rank): no claim
            return None
        return found if found.group == group else None
