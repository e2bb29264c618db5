"""Views, layouts, indexing, joins, parts and growth: axes moved, cut, merged, copied."""

import torch

from ... import _ops
from ..._values import is_tensor
from .. import axes as _axes
from .. import dims as D
from ..dims import BATCH, COPY, FEATURE, STRUCTURE, TOKEN, Axis
from ..intent import count_intents
from .base import (
    Made,
    first_tensor,
    propagates,
    tag_at,
    tags_if_any,
    wrapped_dim,
)


# -- views ------------------------------------------------------------------------------------------
def regroup_view(meta, src_shape, dst_shape) -> tuple[list[Axis], list[bool]]:
    """Axes of a view from `src_shape` to `dst_shape`, and per target axis whether it
    came out of an entangled group (then it is a new axis)."""
    src_shape, dst_shape = tuple(int(s) for s in src_shape), tuple(int(s) for s in dst_shape)
    out: list[Axis] = [()] * len(dst_shape)
    entangled = [False] * len(dst_shape)
    groups = _axes.view_groups(src_shape, dst_shape)
    if groups is None:
        whole = D.regroup(meta.dims, dst_shape)
        if whole is not None:
            return whole, entangled
        return [D.fresh(s, origin="view") for s in dst_shape], [True] * len(dst_shape)
    for gi, gj in groups:
        made = D.regroup([meta.dims[i] for i in gi], [dst_shape[j] for j in gj])
        if made is None:
            for j in gj:
                out[j] = D.fresh(dst_shape[j], origin="an entangled view")
                entangled[j] = True
        else:
            for j, axis in zip(gj, made, strict=True):
                out[j] = axis
    return out, entangled


@propagates(_ops.VIEW)
def _view(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    out = outputs[0]
    if call.spec.name == "view_as_complex" and x.dim() >= 1 and out.dim() == x.dim() - 1:
        return [Made(m.dims[:-1], m.tags[:-1] if m.tags else (), m.role, m.rotary, m.param)]
    if call.spec.name == "view_as_real" and out.dim() == x.dim() + 1:
        return [Made((*m.dims, D.fresh(2, origin="real and imaginary")), (), m.role, m.rotary)]
    axes, _ = regroup_view(m, x.shape, out.shape)
    _name_head_split(call, m, x.shape, out.shape, axes)
    # A view keeps the order of whole axes: self-attention's scores hold one axis twice
    # (queries, then keys), so each occurrence takes its own tag, in order.
    by_axis: dict = {}
    for i, a in enumerate(m.dims):
        if a:
            by_axis.setdefault(a, []).append(tag_at(m, i))
    tags = tags_if_any([by_axis[a].pop(0) if by_axis.get(a) else None for a in axes])
    return [Made(tuple(axes), tags, m.role, m.rotary, m.param)]


def _name_head_split(call, meta, src_shape, dst_shape, axes) -> None:
    """A view that cuts a feature axis into [.., heads, d_k] names the two factors, when
    the module declares those sizes (the second source of names, after structure)."""
    groups = _axes.view_groups(tuple(src_shape), tuple(dst_shape)) or []
    declared = None
    for gi, gj in groups:
        real_i = [i for i in gi if src_shape[i] != 1]
        real_j = [j for j in gj if dst_shape[j] != 1]
        if len(real_i) != 1 or len(real_j) < 2:
            continue
        if D.kind_of(meta.dims[real_i[0]]) in (TOKEN, BATCH):
            continue
        a, b = real_j[-2], real_j[-1]
        if len(axes[a]) != 1 or len(axes[b]) != 1:
            continue
        if declared is None:
            declared = {axis: size for axis, (_, size) in call.declared().items()}
        if dst_shape[b] != declared.get("d_k"):
            continue
        if dst_shape[a] == declared.get("heads"):
            heads = "heads"
        elif dst_shape[a] == declared.get("kv_heads"):
            heads = "kv_heads"
        else:
            continue
        D.claim_part(axes[b][0], "d_k", D.DECLARED)
        D.claim_part(axes[a][0], heads, D.DECLARED)


# -- layouts --------------------------------------------------------------------------------------
def layout_order(call, ndim: int) -> list[int] | None:
    """The permutation a layout op applies: output axis i is input axis order[i]."""
    args = call.args
    name = call.spec.name
    if name == "transpose":
        bound = _ops.bind(call.spec, args, call.kwargs)
        d0, d1 = wrapped_dim(bound.get("dim0"), ndim), wrapped_dim(bound.get("dim1"), ndim)
        if d0 is None or d1 is None:
            return None
        order = list(range(ndim))
        order[d0], order[d1] = order[d1], order[d0]
        return order
    if name == "permute":
        rest = args[1:]
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], tuple | list) else rest
        dims = dims or call.kwargs.get("dims", ())
        if len(dims) != ndim:
            return None
        return [int(d) % ndim for d in dims]
    if name == "movedim":
        bound = _ops.bind(call.spec, args, call.kwargs)
        src, dst = bound.get("source"), bound.get("destination")
        src = [src] if isinstance(src, int) else list(src or ())
        dst = [dst] if isinstance(dst, int) else list(dst or ())
        if len(src) != len(dst):
            return None
        src, dst = [s % ndim for s in src], [d % ndim for d in dst]
        rest = [i for i in range(ndim) if i not in src]
        placed: list[int | None] = [None] * ndim
        for s, d in zip(src, dst, strict=True):
            placed[d] = s
        it = iter(rest)
        return [o if o is not None else next(it) for o in placed]
    if name == "mT" or (name == "t" and ndim <= 2):
        if ndim < 2:
            return list(range(ndim))
        return [*range(ndim - 2), ndim - 1, ndim - 2]
    if name == "t":
        return list(reversed(range(ndim)))
    return None


@propagates(_ops.LAYOUT)
def _layout(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    order = layout_order(call, x.dim())
    if order is None:
        return None
    dims = tuple(m.dims[i] for i in order)
    tags = tuple(tag_at(m, i) for i in order) if m.tags else ()
    moved = order != list(range(len(order)))
    return [Made(dims, tags, m.role, m.rotary, m.param, moved or m.laid_out)]


# -- indexing --------------------------------------------------------------------------------------
def _slice_axis(axis: Axis, size: int, positions=None) -> Axis:
    """Part of an axis along it (`x[:, :T]`): a new dim that keeps the name and kind, and
    (`positions`, the indices kept) where along a one-factor axis it was cut."""
    if size == D.size_of(axis):
        return axis
    if size == 1:
        return ()
    name, rank, kind, kind_rank, origin = None, 0, None, 0, "a slice"
    sides = (False, False)
    if len(axis) == 1:
        atom = axis[0]
        root = atom[0].find()
        name = D.atom_name(atom)
        rank = (
            root.rank
            if D.is_whole(atom)
            else (root.parts or {}).get((atom[1], atom[2]), ("", 0))[1]
        )
        kind, kind_rank = root.kind, root.kind_rank
        origin = f"a slice of {root.origin}" if root.origin else "a slice"
        sides = (root.q_side, root.k_side)
        if name in ("seq_q", "seq_k"):
            name = "seq"
    elif axis:
        kind = D.kind_of(axis)
        kind_rank = D.CONVENTION if kind else 0
    made = D.fresh(size, name=name, rank=rank, kind=kind, kind_rank=kind_rank, origin=origin)
    if made:
        made[0][0].q_side, made[0][0].k_side = sides
        if positions is not None and len(axis) == 1 and len(positions) == size:
            made[0][0].cut = (axis[0], positions)
    return made


@propagates(_ops.INDEX)
def _index(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    op = call.spec.name
    out = outputs[0]
    ndim = x.dim()
    if op == "__getitem__" and len(call.args) >= 2:
        return _getitem(call, x, m, call.args[1], out)
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    d = wrapped_dim(bound.get("dim"), ndim)
    if d is None:
        return None
    if op == "select":
        return [Made(m.dims[:d] + m.dims[d + 1 :], _drop_tag(m, d))]
    if op == "narrow":
        axes = list(m.dims)
        start, size = bound.get("start"), int(out.shape[d])
        kept = (
            range(start % x.shape[d], start % x.shape[d] + size) if isinstance(start, int) else None
        )
        axes[d] = _slice_axis(m.dims[d], size, kept)
        return [Made(tuple(axes), m.tags, m.role)]
    index = bound.get("index")
    if op == "index_select" and is_tensor(index) and index.dim() == 1:
        axes = list(m.dims)
        axes[d] = call.meta_of(index).dims[0] if index.numel() > 1 else ()
        return [Made(tuple(axes))]
    if op == "gather" and is_tensor(index) and index.dim() == ndim:
        im = call.meta_of(index)
        gathered = tuple(
            im.dims[i] if i == d or index.shape[i] != x.shape[i] else m.dims[i] for i in range(ndim)
        )
        return [Made(gathered)]
    return None


def _drop_tag(m, d: int) -> tuple:
    return tuple(t for i, t in enumerate(m.tags) if i != d) if m.tags else ()


def _getitem(call, x, m, index, out):
    items = index if isinstance(index, tuple) else (index,)
    tensors = [i for i in items if is_tensor(i)]
    if tensors:
        return _advanced_index(call, x, m, items, out)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    lists = sum(1 for i in items if isinstance(i, list))
    if lists > 1 or (lists and any(isinstance(i, int) for i in items)):
        return None  # several advanced indices: torch may move their axes to the front
    axes: list[Axis] = []
    tags: list = []
    kept: list = []  # per output axis, the positions of its input axis it kept (or None)
    pos = 0
    for item in items:
        if item is None:
            axes.append(())
            tags.append(None)
            kept.append(None)
        elif item is Ellipsis:
            keep = x.dim() - consumed
            if keep < 0:
                return None
            for k in range(pos, pos + keep):
                axes.append(m.dims[k])
                tags.append(tag_at(m, k))
                kept.append(None)
            pos += keep
        elif isinstance(item, slice) or _int_list(item):
            if pos >= x.dim():
                return None
            axes.append(m.dims[pos])  # sized below, from the output
            tags.append(tag_at(m, pos))
            n = int(x.shape[pos])
            if isinstance(item, slice):
                kept.append(range(*item.indices(n)))
            else:
                kept.append(tuple(i % n for i in item))  # x[..., [-2]]: those positions
            pos += 1
        elif isinstance(item, int) and not isinstance(item, bool):
            pos += 1
        else:
            return None
    for k in range(pos, x.dim()):
        axes.append(m.dims[k])
        tags.append(tag_at(m, k))
        kept.append(None)
    if len(axes) != out.dim():
        return None
    sized = tuple(_slice_axis(a, int(s), c) for a, s, c in zip(axes, out.shape, kept, strict=True))
    return [Made(sized, tags_if_any(tags), m.role, m.rotary, m.param)]


def _int_list(item) -> bool:
    """A list of ints indexing one axis (`qkv[..., [-2]]`), not of bools."""
    return (
        isinstance(item, list)
        and bool(item)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in item)
    )


def _advanced_index(call, x, m, items, out):
    """One integer tensor index among slices (`table[idx]`, `x[:, idx]`): the indexed
    axis becomes the index's axes; anything else is a new tensor."""
    if Ellipsis in items or None in items:
        return None
    tensors = [(k, i) for k, i in enumerate(items) if is_tensor(i)]
    if len(tensors) != 1:
        return None
    k, index = tensors[0]
    if index.dtype == torch.bool or any(
        not (isinstance(i, slice) and i == slice(None)) for j, i in enumerate(items) if j != k
    ):
        return None
    im = call.meta_of(index)
    if k == 0 and m.param and x.dim() >= 2 and not index.dtype.is_floating_point:
        # Rows of a parameter looked up by index (a relative-position bias table): an
        # embedding, whose columns are features (the heads of a bias table).
        for axis in m.dims[1:]:
            D.claim_atoms(axis, FEATURE, D.PARAM)
    axes = (*m.dims[:k], *im.dims, *m.dims[k + 1 :])
    return [Made(tuple(axes))]


# -- joins and parts ------------------------------------------------------------------------------
@propagates(_ops.JOIN)
def _join(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    tensors = bound.get("tensors")
    if (
        not isinstance(tensors, tuple | list)
        or not tensors
        or not all(is_tensor(t) for t in tensors)
    ):
        return None
    out = outputs[0]
    if call.spec.name == "cat":
        # torch.cat skips legacy empty 1-D operands (a cache started as torch.tensor([])).
        kept = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
        if kept and len(kept) < len(tensors):
            tensors = kept
            if len(kept) == 1:
                m = call.meta_of(kept[0])
                return [Made(m.dims, m.tags, m.role, m.rotary)]
    metas = [call.meta_of(t) for t in tensors]
    ndim = tensors[0].dim()
    dim = bound.get("dim", 0)
    if call.spec.name == "stack":
        d = wrapped_dim(dim, ndim + 1)
        if d is None:
            return None
        lined = _line_up_all(tensors, metas, range(ndim))
        axes = (*lined[:d], D.fresh(len(tensors), origin="stack"), *lined[d:])
        return [Made(tuple(axes))]
    d = wrapped_dim(dim, ndim)
    if d is None or out.dim() != ndim:
        return None
    lined = _line_up_all(tensors, metas, [i for i in range(ndim) if i != d])
    parts = [m.dims[d] for m in metas]
    joined = list(lined)
    joined.insert(d, _joined_axis(parts, int(out.shape[d])))
    tags = [tag_at(metas[0], i) for i in range(ndim)]
    return [
        Made(tuple(joined), tags_if_any(tags), _common_role(metas), all(m.rotary for m in metas))
    ]


def _line_up_all(tensors, metas, positions) -> list[Axis]:
    axes = []
    for i in positions:
        chosen: Axis = ()
        for t, m in zip(tensors, metas, strict=True):
            if t.shape[i] == 1:
                continue
            if not chosen:
                chosen = m.dims[i]
            else:
                D.line_up(chosen, m.dims[i])
        axes.append(chosen)
    return axes


def _joined_axis(parts: list[Axis], size: int) -> Axis:
    """The axis a concatenation makes: a new dim, named and kinded like its parts when
    they agree (a cache of seq + new seq is seq; two halves of d_k are d_k)."""
    names = {D.known_name(p) for p in parts if p}
    kinds = {D.kind_of(p) for p in parts if p} - {None}
    name = names.pop() if len(names) == 1 else None
    if name in ("seq_q", "seq_k"):
        name = "seq"
    kind = kinds.pop() if len(kinds) == 1 else None
    made = D.fresh(
        size,
        name=name,
        rank=D.CONVENTION if name else 0,
        kind=kind,
        kind_rank=D.CONVENTION if kind else 0,
        origin="a concatenation",
    )
    if made:
        roots = [a[0].find() for p in parts for a in p]
        made[0][0].q_side = any(r.q_side for r in roots)
        made[0][0].k_side = any(r.k_side for r in roots)
        made[0][0].joined = tuple(parts)
    return made


def _common_role(metas) -> str | None:
    roles = {m.role for m in metas}
    return roles.pop() if len(roles) == 1 else None


@propagates(_ops.PART)
def _part(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    ndim = x.dim()
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    d = wrapped_dim(bound.get("dim", 0), ndim)
    if d is None:
        return None
    if call.spec.name == "unbind":
        return [Made(m.dims[:d] + m.dims[d + 1 :], _drop_tag(m, d), m.role) for _ in outputs]
    made = []
    declared = None
    start = 0
    for out in outputs:
        if out.dim() != ndim:
            return None
        axes = list(m.dims)
        size = int(out.shape[d])
        part = _slice_axis(m.dims[d], size, range(start, start + size))
        start += size
        if part is not m.dims[d] and part and D.kind_of(m.dims[d]) == FEATURE:
            if declared is None:
                declared = call.declared()
            d_model = declared.get("d_model")
            if d_model is not None and size == d_model[1] and D.atom_name(part[0]) is None:
                D.claim_part(part[0], "d_model", D.DECLARED)
        axes[d] = part
        made.append(Made(tuple(axes), m.tags, m.role, m.rotary))
    return made


# -- growth ----------------------------------------------------------------------------------------
def _copy(size: int) -> Axis:
    return D.fresh(size, kind=COPY, kind_rank=STRUCTURE, origin="a broadcast copy")


def _count_copies(call, axes: list[Axis], copies: list[bool]) -> None:
    """Copy axes whose count the user read from an axis (`.repeat(bsz, 1, 1, 1)` after
    `bsz, T, _ = h.size()`) stand for that axis in the user's names (`dims.copy_of`); a
    count the module declares as its heads (`self.n_heads`) names the copy one per head."""
    if not any(copies):
        return
    intents = count_intents(call, len(axes))
    for axis, copy, intent in zip(axes, copies, intents, strict=False):
        if not copy or intent is None or intent.part or not axis:
            continue
        if intent.axis is not None:
            D.copy_of(axis, intent.axis)
        elif intent.name == "heads":
            for dim, _, _ in axis:
                if dim.find().kind == COPY:
                    D.claim_name(dim, "heads", D.DECLARED)


@propagates(_ops.GROW)
def _grow(call, outputs):
    x = first_tensor(call)
    if x is None:
        return None
    m = call.meta_of(x)
    out = outputs[0]
    op = call.spec.name
    shape, new = tuple(x.shape), tuple(out.shape)
    if op == "expand":
        lead = len(new) - len(shape)
        if lead < 0:
            return None
        axes: list[Axis] = [_copy(s) for s in new[:lead]]
        for k, (old, size) in enumerate(zip(shape, new[lead:], strict=True)):
            axes.append(m.dims[k] if old == size else _copy(size))
        _count_copies(call, axes, [k < lead or shape[k - lead] != new[k] for k in range(len(new))])
        tags = (None,) * lead + m.tags if m.tags else ()
        return [Made(tuple(axes), tags, m.role, m.rotary)]
    if op == "repeat":
        reps = call.args[1:]
        if len(reps) == 1 and isinstance(reps[0], tuple | list):
            reps = tuple(reps[0])
        if not reps or not all(isinstance(r, int) for r in reps):
            return None
        reps = (1,) * (len(shape) - len(reps)) + tuple(reps)
        lead = len(reps) - len(shape)
        axes = [_copy(r) for r in reps[:lead]]
        for k, r in enumerate(reps[lead:]):
            # repeat tiles whole blocks: the copy is the outer factor.
            axes.append(D.normalize((*_copy(r), *m.dims[k])) if r > 1 else m.dims[k])
        # A copy tiled onto a real axis is the composite's outer factor (only named: an alias
        # is for a copy that is the axis whole, `dims.copy_of`).
        copies = [k < lead or reps[k] > 1 for k in range(len(reps))]
        _count_copies(call, axes, copies)
        return [Made(tuple(axes), (), m.role)]
    if op == "repeat_interleave":
        bound = _ops.bind(call.spec, call.args, call.kwargs)
        repeats, d = bound.get("repeats"), wrapped_dim(bound.get("dim"), x.dim())
        if not isinstance(repeats, int) or d is None:
            return None
        axes = list(m.dims)
        # Each element repeated in place: the copy is the inner factor.
        copy = _copy(repeats)
        axes[d] = D.normalize((*m.dims[d], *copy)) if repeats > 1 else m.dims[d]
        site = call.site
        if copy and site is not None and call.site_matches() and site.args:
            _count_copies(call, [copy, *[()] * (len(site.args) - 1)], [True])
        return [Made(tuple(axes), m.tags, m.role)]
    if op == "pad":
        return _pad(call, m, shape, new)
    return None


def _pad(call, m, shape: tuple, new: tuple) -> list[Made] | None:
    """F.pad(x, (left, right, top, bottom, ...)) pads the last len(pad) // 2 axes: the
    others keep their identity (the batch of a "same"-padded conv's input stays the
    batch); a padded axis holds new positions, so it is a new axis."""
    widths = _ops.bind(call.spec, call.args, call.kwargs).get("pad")
    if not isinstance(widths, tuple | list) or len(widths) % 2 or len(shape) != len(new):
        return None
    if not all(isinstance(w, int) for w in widths) or len(widths) // 2 > len(shape):
        return None
    axes, tags = list(m.dims), list(m.tags)
    for k in range(len(widths) // 2):
        d = len(shape) - 1 - k
        if widths[2 * k] or widths[2 * k + 1]:
            axes[d] = D.fresh(new[d], origin="padded positions")
            if tags:
                tags[d] = None
    return [Made(tuple(axes), tuple(tags), m.role)]
