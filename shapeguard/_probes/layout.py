"""Which input axes are batch and which are tokens, read from the trace's axis provenance.

After one traced forward every axis of every input carries an identity (`_names/dims`):
its kind (batch, token, feature) from the ops that consumed it, and a root shared by
every axis it was lined up with. The probes read the inputs' roles from it, never
from parameter names:

- token ids: an integer input an embedding read (edited by drawing other ids);
- data: any other floating input with a batch or token axis (activations, images,
  audio, rotary tables handed in: redrawn with noise);
- masks: an input whose values an op applied to attention scores (read back with
  `masks.MaskUse`), or a bool input; its polarity, keep or hide, is read from how the
  module applied it: the keys that no query saw are its padding;
- other: everything else (position ids, a constant): moved with its tokens, never
  redrawn.

Token axes are grouped by identity: a memory as long as the target is another
sequence. Group 0 holds the queries: the tokens whose positions the output keeps;
a group whose positions no output keeps (an image's height and width, audio
frames before a strided conv) is read but never cut. Where an axis has no kind (a
mask the module only indexed), its size decides, and a size shared by the batch and a
sequence, or by two sequences, leaves the probes that need it skipped (`ambiguous`).
"""

import math

import torch

from .._names import dims as D
from .contractions import contracted_batch, conventional_batch_roots
from .layout_masks import by_size, is_additive_mask, is_binary, read_masks
from .layout_records import Layout, Leaf, OutLeaf, axis_kind, root_of, roots_of
from .tree import leaves


def read_layout(
    found: list[tuple[tuple, torch.Tensor]],
    names: dict[tuple, str],
    metas: dict[tuple, object],
    watch,
    outputs: list[tuple[tuple, torch.Tensor, object]],
) -> Layout | str:
    """The probes' view of the inputs (or why there is none), from the trace's provenance:
    `metas` are the inputs' metas when the trace ended, `outputs` the traced output's
    floating tensors with theirs."""
    dims = {}
    for path, t in found:
        meta = metas.get(path)
        axes = getattr(meta, "dims", None)
        dims[path] = axes if axes is not None and len(axes) == t.dim() else ((),) * t.dim()
    embedded = [{id(r) for axis in axes for r in roots_of(axis)} for axes, _ in watch.embedded]
    rows = {}
    kinds: dict[tuple, str] = {}
    for path, t in found:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            kinds[path] = "data"
            continue
        own = {id(r) for axis in dims[path] for r in roots_of(axis)}
        hits = [
            i for i, roots in enumerate(embedded) if own and own <= roots and t.dtype != torch.bool
        ]
        # The table that reads these values holds every one of them: a position table
        # indexed by positions made from the ids (FSMT's, 130 rows beside a vocabulary
        # of 42024) shares their axes, not their values.
        top = int(t.max()) if t.numel() and t.device.type != "meta" else -1
        hit = next((i for i in hits if watch.embedded[i][1] > top), hits[0] if hits else None)
        if hit is not None:
            kinds[path] = "ids"
            rows[path] = watch.embedded[hit][1]
        else:
            kinds[path] = "mask" if t.dtype == torch.bool else "other"
    # Masks: additive floats (0 and very negative), and any input whose values are
    # what an op hid from the scores (or their inverse): a 0/1 float mask too.
    from .masks import matches

    for path, t in found:
        if kinds[path] in ("ids", "mask") or t.device.type != "cpu":
            continue
        if kinds[path] == "data" and is_additive_mask(t):
            kinds[path] = "mask"
            continue
        if t.numel() > 1 << 22 or not is_binary(t):
            continue
        if any(matches(t != 0, use) for use in watch.mask_uses):
            kinds[path] = "mask"

    # Batch: the batch axes of ids and data; their size is the batch size.
    batch_roots: set[int] = set()
    batch_size = None
    batch_axis: dict[tuple, int | None] = {}
    for path, t in found:
        axes = dims[path]
        hits = [d for d, a in enumerate(axes) if axis_kind(a) == D.BATCH]
        axis = batch_axis[path] = hits[0] if len(hits) == 1 else None
        if axis is not None and kinds[path] in ("ids", "data"):
            root = root_of(axes[axis])
            if root is not None:
                batch_roots.add(id(root))
            if batch_size is None:
                batch_size = int(t.shape[axis])

    for path, t in found:
        axis = batch_axis[path]
        if axis is not None and batch_size is not None and int(t.shape[axis]) != batch_size:
            # Named batch by the batch-first convention only: a [2, edges] edge index
            # beside [nodes, features] holds no examples.
            batch_axis[path] = None
    addressed = _addressed(found, dims, kinds, names, batch_axis, watch)
    named = {path: names.get(path, _path_name(path)) for path, _ in found}
    contracted = contracted_batch(found, dims, kinds, named, batch_axis, watch)

    if batch_size is None:
        # A batch of one has no batch dim (a size-1 axis carries nothing): the leading
        # axis of ids and data, by the batch-first convention.
        for path, t in found:
            if kinds[path] in ("ids", "data") and t.dim() >= 2 and t.shape[0] == 1:
                batch_axis[path] = 0
                batch_size = 1
        for path, t in found:
            lead = t.dim() >= 2 and t.shape[0] == 1 and batch_axis[path] is None
            if kinds[path] not in ("ids", "data") and batch_size == 1 and lead:
                batch_axis[path] = 0

    # Token groups: distinct token roots of ids and data, in order of appearance.
    group_of: dict[int, int] = {}
    group_roots: list = []
    group_names: list[str] = []
    for path, t in found:
        if kinds[path] not in ("ids", "data"):
            continue
        for d, axis in enumerate(dims[path]):
            root = root_of(axis)
            if root is None or axis_kind(axis) != D.TOKEN or int(t.shape[d]) < 1:
                continue
            if id(root) not in group_of:
                group_of[id(root)] = len(group_roots)
                group_roots.append(root)
                group_names.append(names.get(path, _path_name(path)))

    # Group 0: the tokens the outputs keep (the queries).
    out_groups: list[int] = []
    for _, _t, meta in outputs:
        for axis in getattr(meta, "dims", ()) or ():
            root = root_of(axis)
            if root is not None and id(root) in group_of and group_of[id(root)] not in out_groups:
                out_groups.append(group_of[id(root)])
    aliases: dict[int, int] = {}
    if group_roots and not out_groups:
        # No output axis is one of the inputs' token axes: an output axis of a token
        # group's length, which no other size in play has, stands for it (a position
        # mixing made by a [seq, seq] buffer is still over the tokens).
        aliases = _by_length(outputs, group_roots, batch_size)
        out_groups = sorted(set(aliases.values()))
    order = out_groups + [g for g in range(len(group_roots)) if g not in out_groups]
    group_roots = [group_roots[g] for g in order]
    group_names = [group_names[g] for g in order]
    group_of = {id(r): i for i, r in enumerate(group_roots)}
    group_of.update({key: order.index(g) for key, g in aliases.items()})
    lengths = [int(r.size) for r in group_roots]
    layout = Layout(
        batch_size,
        lengths,
        {},
        outputs=[],
        queries=bool(out_groups),
        group_names=group_names,
        roots=list(group_roots),
    )
    if group_roots and not out_groups:
        layout.made_inside = _not_kept(group_roots, group_names, watch, outputs)

    for path, t in found:
        name = names.get(path, _path_name(path))
        leaf = Leaf(path, name, kinds[path], batch_axis[path])
        leaf.dtype = (
            "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"
        )
        for d, axis in enumerate(dims[path]):
            root = root_of(axis)
            if root is not None and id(root) in group_of and d != leaf.batch:
                leaf.seq[d] = group_of[id(root)]
        if kinds[path] == "ids":
            leaf.ids_range = _ids_range(t, rows[path])
        if kinds[path] in ("mask", "other"):
            by_size(layout, leaf, t, dims[path], watch.mask_uses, group_roots)
        if leaf.kind == "data" and leaf.batch is None and not leaf.seq:
            leaf.kind = "other"
        layout.leaves[path] = leaf
    read_masks(layout, found, dims, watch, group_roots)
    for path, t in found:
        leaf = layout.leaves[path]
        if leaf.kind in ("mask", "other") and not layout.ambiguous:
            known = {layout.batch_size, *layout.lengths}
            loose = [
                d
                for d in range(t.dim())
                if d != leaf.batch
                and d not in leaf.seq
                and int(t.shape[d]) in known
                and int(t.shape[d]) > 1
                and axis_kind(dims[path][d]) != D.FEATURE
            ]
            applied = [d for d in loose if any(u.target[-1] == t.shape[d] for u in watch.mask_uses)]
            # A mask no op applied (an all-ones mask the module skipped) is left as it is.
            if applied and leaf.batch is not None and leaf.kind == "mask":
                layout.ambiguous = (
                    f"{leaf.name} {list(t.shape)}: batch and seq (or two sequences) are both "
                    f"{int(t.shape[applied[0]])}, so its axes cannot be told apart; use distinct sizes"
                )
    layout.unbatched = _unbatched(layout, found)
    layout.ambiguous_batch = layout.ambiguous_batch or addressed or contracted
    layout.not_batch = contracted
    layout.outputs = _out_leaves(outputs, batch_roots, group_of, batch_size, lengths)
    if not layout.queries and any(leaf.seq for leaf in layout.outputs):
        layout.queries, layout.made_inside = True, ""
    return layout


def _not_kept(group_roots: list, group_names: list[str], watch, outputs) -> str:
    """Why no output keeps a token axis, from what the trace saw: the op that cut,
    pooled or convolved the first axis it saw taken out, or the output axis it was merged
    into; nothing more where it saw neither."""
    from .cuts import cut_of, merged, said

    axes = ", ".join(
        f"{D.known_name(((r, 1, r.size),)) or 'axis'} of {n}"
        for r, n in zip(group_roots, group_names, strict=True)
    )
    head = f"the outputs keep none of the inputs' token axes ({axes})"
    for root in group_roots:
        how = merged(outputs, root)
        cut = cut_of(watch.cuts, root) if not how else None
        how = how or (said(cut) if cut is not None else "")
        if how:
            return f"{head}: {how}"
    return head


def _addressed(found, dims, kinds, names, batch_axis, watch) -> str:
    """Why the batch axis of the inputs is not known to hold separate examples, if it is
    not: only the batch-first convention names it, and the module picks or writes its
    rows by the values of another input (a graph's nodes read through its edge index:
    each row is addressed by others' numbers, as no batch's example is)."""
    for path, _t, axis, rows in conventional_batch_roots(found, dims, kinds, batch_axis):
        for indexed, index_roots, where in watch.addressed:
            if indexed.find() is not rows:
                continue
            by = {id(r.find()) for r in index_roots}
            for other, u in found:
                if other == path or u.is_floating_point() or kinds[other] == "ids":
                    continue
                own = {id(atom[0].find()) for a in dims[other] for atom in a}
                if own & by:
                    name, source = (
                        names.get(path, _path_name(path)),
                        names.get(other, _path_name(other)),
                    )
                    return (
                        f"axis {axis} of {name} is the batch only by the batch-first "
                        f"convention, and {where} picks its rows by the values of {source}: "
                        "rows addressed by one another's numbers (graph nodes, set "
                        "elements) are not known to be separate examples"
                    )
    return ""


def _unbatched(layout: Layout, found) -> str:
    """Why the probes cannot resize the batch: an input of ids or data with no batch axis
    the trace knows but an axis as long as the batch (raw audio whose first axis the
    trace never took for the batch): cut with the others, or not, is a guess."""
    b = layout.batch_size
    if not b or b < 2:
        return ""
    for path, t in found:
        leaf = layout.leaves[path]
        if leaf.kind not in ("ids", "data") or leaf.batch is not None:
            continue
        hits = [d for d in range(t.dim()) if d not in leaf.seq and int(t.shape[d]) == b]
        if hits:
            return (
                f"{leaf.name} {list(t.shape)}: its axis {hits[0]} is as long as the batch "
                f"({b}), but the trace does not show it is the batch, so a probe that "
                "resizes the batch cannot keep it consistent with the other inputs"
            )
    return ""


def _by_length(outputs, group_roots: list, batch_size) -> dict[int, int]:
    """{id of an output axis's dim: group} for output axes as long as exactly one token
    group, where that length is no other size of the output or the batch."""
    lengths = [int(r.size) for r in group_roots]
    found: dict[int, int] = {}
    for _, t, meta in outputs:
        axes = getattr(meta, "dims", None)
        if axes is None or len(axes) != t.dim():
            continue
        sizes = [int(n) for n in t.shape]
        for d, axis in enumerate(axes):
            root = root_of(axis)
            n = sizes[d]
            if root is None or axis_kind(axis) not in (None, D.TOKEN) or lengths.count(n) != 1:
                continue
            if n == batch_size or sizes.count(n) != 1:
                continue
            found[id(root)] = lengths.index(n)
    return found


def _ids_range(t: torch.Tensor, rows: int) -> tuple[int, int]:
    """The ids new ids are drawn from: those the input uses, never special low ids it
    does not (a pad id), within the table."""
    if t.numel() == 0 or t.device.type == "meta":
        return (0, max(rows - 1, 0))
    values = t.detach().reshape(-1).cpu()
    common = torch.mode(values).values
    rest = values[values != common] if bool((values != common).any()) else values
    lo, hi = max(int(rest.min()), 0), int(rest.max())
    # Within the table where it holds them; ids it does not hold are read after an
    # offset or by another table: the values the input uses are the evidence then.
    return (lo, min(hi, rows - 1)) if rows - 1 >= lo else (lo, max(hi, lo))


def _out_leaves(outputs, batch_roots: set, group_of: dict, batch_size, lengths) -> list[OutLeaf]:
    found = []
    for path, t, meta in outputs:
        axes = getattr(meta, "dims", None)
        if axes is None or len(axes) != t.dim():
            # Made where the session did not look (a DTensor's redistribution in a
            # parallel style's hook): its axes by size, where sizes are unambiguous.
            leaf = _by_size_alone(path, t, batch_size, lengths)
            if leaf is not None:
                found.append(leaf)
            continue
        batch, seq = [], {}
        for d, axis in enumerate(axes):
            root = root_of(axis)
            if root is not None and id(root) in batch_roots:
                batch.append(d)
            elif root is not None and id(root) in group_of:
                seq[d] = group_of[id(root)]
            elif axis_kind(axis) == D.BATCH and int(t.shape[d]) == batch_size:
                batch.append(d)
        loose = tuple(
            d
            for d, axis in enumerate(axes)
            if d not in batch
            and d not in seq
            and int(t.shape[d]) == batch_size
            and axis_kind(axis) not in (D.FEATURE, D.TOKEN)
        )
        unplaced = tuple(
            d
            for d, axis in enumerate(axes)
            if d not in batch
            and d not in seq
            and int(t.shape[d]) in lengths
            and axis_kind(axis) != D.FEATURE
        )
        folded = {
            d: where
            for d, axis in enumerate(axes)
            if d not in batch and (where := _folded_batch(axis, batch_roots)) is not None
        }
        if batch or seq or folded:
            found.append(OutLeaf(path, tuple(batch), seq, loose, unplaced, folded))
    return found


def _folded_batch(axis, batch_roots: set) -> tuple[int, int] | None:
    """(outer, inner) where an output axis holds the inputs' batch whole as one of its
    factors and no other part of it ([batch * windows] after a window partition): the
    sizes of the factors outside and inside it. None for any other axis."""
    atoms = D.normalize(axis)
    if len(atoms) < 2:
        return None
    hits = [k for k, a in enumerate(atoms) if id(a[0]) in batch_roots]
    if len(hits) != 1 or not D.is_whole(atoms[hits[0]]):
        return None
    k = hits[0]
    return math.prod(a[2] for a in atoms[:k]), math.prod(a[2] for a in atoms[k + 1 :])


def _by_size_alone(path, t, batch_size, lengths) -> OutLeaf | None:
    sizes = [int(n) for n in t.shape]
    batch = tuple(
        d
        for d, n in enumerate(sizes)
        if n == batch_size and sizes.count(n) == 1 and n not in lengths
    )
    seq = {
        d: lengths.index(n)
        for d, n in enumerate(sizes)
        if d not in batch and lengths.count(n) == 1 and sizes.count(n) == 1 and n != batch_size
    }
    return OutLeaf(path, batch, seq) if batch or seq else None


def _path_name(path: tuple) -> str:
    return ".".join(str(p) for p in path[1:]) or "input"


def input_leaves(args: tuple, kwargs: dict) -> list[tuple[tuple, torch.Tensor]]:
    return leaves((args, kwargs))
