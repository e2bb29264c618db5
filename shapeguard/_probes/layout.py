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

from dataclasses import dataclass, field

import torch

from .._names import dims as D
from .tree import leaves


@dataclass(slots=True)
class Leaf:
    """One tensor among the inputs: where it sits, what it is, which axes are which."""

    path: tuple
    name: str
    kind: str  # "ids", "data", "mask", "other"
    batch: int | None = None
    seq: dict[int, int] = field(default_factory=dict)  # axis -> token group
    ids_range: tuple[int, int] | None = None  # ids: the values new ids are drawn from
    avoid: frozenset = frozenset()  # ids: values never drawn (the model's pad id)
    polarity: str = ""  # padding mask: "keep" (nonzero = a real token) or "hide"
    padding: bool = False  # a [batch, seq] padding mask (one token axis), polarity known
    dtype: str = ""  # "float", "bool" or "int"; "additive" for a 0 / -inf float mask


@dataclass(slots=True)
class OutLeaf:
    """One floating tensor of the output, with its batch axes and token axes."""

    path: tuple
    batch: tuple[int, ...] = ()
    seq: dict[int, int] = field(default_factory=dict)  # axis -> token group
    # Axes as long as the batch that are not known to be it, nor features nor tokens
    # (CLIP's images-by-texts logits): its examples cannot be compared one by one.
    loose: tuple[int, ...] = ()
    # Axes as long as a token group that the trace does not place (not the batch, not a
    # group's tokens, not features: PEGASUS-X's encoder output after its padding to the
    # block size is cut back): which of their rows are padding cannot be told.
    unplaced: tuple[int, ...] = ()


@dataclass(slots=True)
class Layout:
    """Batch size, token groups and each leaf's axes, as the probes see the inputs."""

    batch_size: int | None
    lengths: list[int]  # the length of each token group; group 0 holds the queries
    leaves: dict[tuple, Leaf]
    ambiguous: str = ""  # why some token axes cannot be told apart, if they cannot
    ambiguous_batch: str = ""  # why some input's batch axis cannot be told, if it cannot
    # Why the batch cannot be resized (a sub-batch, copies of one example): an input of
    # ids or data has an axis as long as the batch that the trace does not show is it.
    unbatched: str = ""
    batch_dim: int = 0
    seq_dim: int = 1
    outputs: list[OutLeaf] = field(default_factory=list)
    queries: bool = False  # group 0 is a sequence the outputs keep
    group_names: list[str] = field(default_factory=list)  # "input_ids", "memory", ...
    roots: list = field(default_factory=list)  # each group's dim (`_names.dims.Dim`)
    pads: dict[int, torch.Tensor] = field(default_factory=dict)  # group -> bool [batch, len]
    made_inside: str = ""  # why no group is kept by the outputs (patches of an image, ...)
    polarity_unknown: str = ""  # a mask whose polarity the trace could not read
    # Uniform masks no op applied, as long as two sequences: (path, token axis, groups,
    # polarity). `resolve_pending` pads one key and retraces to see which it pads.
    pending: list = field(default_factory=list)

    def padded(self, group: int) -> torch.Tensor | None:
        """bool [batch, length] of padded positions of a group (None: no padding known)."""
        return self.pads.get(group)

    def leaves_of(self, *kinds: str) -> list[Leaf]:
        return [leaf for leaf in self.leaves.values() if leaf.kind in kinds]


def _root(axis) -> D.Dim | None:
    """The dim of an axis that is one dim whole (not a factor, not merged)."""
    if len(axis) != 1:
        return None
    atom = axis[0]
    return atom[0].find() if D.is_whole(atom) else None


def _roots(axis) -> list:
    return [atom[0].find() for atom in axis]


def _kind(axis) -> str | None:
    kind = D.kind_of(axis)
    return None if kind in ("mixed", D.COPY) else kind


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
    embedded = [{id(r) for axis in axes for r in _roots(axis)} for axes, _ in watch.embedded]
    rows = {}
    kinds: dict[tuple, str] = {}
    for path, t in found:
        if t.dtype.is_floating_point or t.dtype.is_complex:
            kinds[path] = "data"
            continue
        own = {id(r) for axis in dims[path] for r in _roots(axis)}
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
        if kinds[path] == "data" and _additive(t):
            kinds[path] = "mask"
            continue
        if t.numel() > 1 << 22 or not _binary(t):
            continue
        if any(matches(t != 0, use) for use in watch.mask_uses):
            kinds[path] = "mask"

    # Batch: the batch axes of ids and data; their size is the batch size.
    batch_roots: set[int] = set()
    batch_size = None
    batch_axis: dict[tuple, int | None] = {}
    for path, t in found:
        axes = dims[path]
        hits = [d for d, a in enumerate(axes) if _kind(a) == D.BATCH]
        axis = batch_axis[path] = hits[0] if len(hits) == 1 else None
        if axis is not None and kinds[path] in ("ids", "data"):
            root = _root(axes[axis])
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
            root = _root(axis)
            if root is None or _kind(axis) != D.TOKEN or int(t.shape[d]) < 1:
                continue
            if id(root) not in group_of:
                group_of[id(root)] = len(group_roots)
                group_roots.append(root)
                group_names.append(names.get(path, _path_name(path)))

    # Group 0: the tokens the outputs keep (the queries).
    out_groups: list[int] = []
    for _, _t, meta in outputs:
        for axis in getattr(meta, "dims", ()) or ():
            root = _root(axis)
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
        axes = ", ".join(
            f"{D.axis_name(((r, 1, r.size),)) or 'axis'} of {n}"
            for r, n in zip(group_roots, group_names, strict=True)
        )
        layout.made_inside = (
            f"the outputs keep none of the inputs' token axes ({axes}): the module makes "
            "its positions inside (patches, strided frames)"
        )

    for path, t in found:
        name = names.get(path, _path_name(path))
        leaf = Leaf(path, name, kinds[path], batch_axis[path])
        leaf.dtype = (
            "float" if t.is_floating_point() else "bool" if t.dtype == torch.bool else "int"
        )
        for d, axis in enumerate(dims[path]):
            root = _root(axis)
            if root is not None and id(root) in group_of and d != leaf.batch:
                leaf.seq[d] = group_of[id(root)]
        if kinds[path] == "ids":
            leaf.ids_range = _ids_range(t, rows[path])
        if kinds[path] in ("mask", "other"):
            _by_size(layout, leaf, t, dims[path], watch.mask_uses, group_roots)
        if leaf.kind == "data" and leaf.batch is None and not leaf.seq:
            leaf.kind = "other"
        layout.leaves[path] = leaf
    _read_masks(layout, found, dims, watch, group_roots)
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
                and _kind(dims[path][d]) != D.FEATURE
            ]
            applied = [d for d in loose if any(u.target[-1] == t.shape[d] for u in watch.mask_uses)]
            # A mask no op applied (an all-ones mask the module skipped) is left as it is.
            if applied and leaf.batch is not None and leaf.kind == "mask":
                layout.ambiguous = (
                    f"{leaf.name} {list(t.shape)}: batch and seq (or two sequences) are both "
                    f"{int(t.shape[applied[0]])}, so its axes cannot be told apart; use distinct sizes"
                )
    layout.unbatched = _unbatched(layout, found)
    layout.ambiguous_batch = layout.ambiguous_batch or addressed
    layout.outputs = _out_leaves(outputs, batch_roots, group_of, batch_size, lengths)
    if not layout.queries and any(leaf.seq for leaf in layout.outputs):
        layout.queries, layout.made_inside = True, ""
    return layout


def _addressed(found, dims, kinds, names, batch_axis, watch) -> str:
    """Why the batch axis of the inputs is not known to hold separate examples, if it is
    not: only the batch-first convention names it, and the module picks or writes its
    rows by the values of another input (a graph's nodes read through its edge index:
    each row is addressed by others' numbers, as no batch's example is)."""
    for path, _t in found:
        axis = batch_axis[path]
        if axis is None or kinds[path] not in ("ids", "data"):
            continue
        atoms = dims[path][axis]
        if len(atoms) != 1 or D.established_kind(atoms[0]) == D.BATCH:
            continue
        rows = atoms[0][0].find()
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
            root = _root(axis)
            n = sizes[d]
            if root is None or _kind(axis) not in (None, D.TOKEN) or lengths.count(n) != 1:
                continue
            if n == batch_size or sizes.count(n) != 1:
                continue
            found[id(root)] = lengths.index(n)
    return found


def _additive(t: torch.Tensor) -> bool:
    """A float mask: 0 where a key is kept and very negative where it is hidden."""
    if t.device.type != "cpu" or t.numel() > 1 << 22 or t.dim() < 2:
        return False
    hidden = t <= -1e4
    return bool(hidden.any()) and bool(((t == 0) | hidden).all())


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


def _by_size(layout: Layout, leaf: Leaf, t: torch.Tensor, axes, uses, group_roots) -> None:
    """A mask's or another input's axes that provenance left unnamed, named by size: the
    batch size, or a group's length, when only one of them has it. A square mask over
    one sequence whose pattern is causal is [seq_q, seq_k], even when batch == seq."""
    square = _square_causal(layout, t, uses, group_roots)
    if square is not None:
        leaf.batch, leaf.seq = None, {0: square, 1: square}
        return
    known = [layout.batch_size, *layout.lengths]
    for d in range(t.dim()):
        size = int(t.shape[d])
        if d == leaf.batch or d in leaf.seq or size == 1:
            continue
        kind = _kind(axes[d]) if axes[d] else None
        if kind == D.FEATURE or size not in known:
            continue
        groups = [g for g, n in enumerate(layout.lengths) if n == size]
        is_batch = size == layout.batch_size
        if t.dim() == 2 and leaf.batch is not None and len(groups) == 1:
            leaf.seq[d] = groups[0]  # [batch, seq]: the other axis is the tokens
        elif is_batch and not groups and leaf.batch is None:
            leaf.batch = d
        elif len(groups) == 1 and not is_batch:
            leaf.seq[d] = groups[0]
        elif (leaf.kind == "mask" or _binary(t)) and leaf.batch is not None:
            continue  # a padding mask's tokens: decided by how the module applied it
        else:
            layout.ambiguous = layout.ambiguous or (
                f"{leaf.name} {list(t.shape)}: batch and seq (or two sequences) are both "
                f"{size}, so its axes cannot be told apart; use distinct sizes"
            )
            if is_batch:
                layout.ambiguous_batch = layout.ambiguous_batch or layout.ambiguous


def _square_causal(layout: Layout, t: torch.Tensor, uses, group_roots) -> int | None:
    """The group of a [seq, seq] mask whose pattern is causal (either polarity): the one
    sequence of that length, or the one a self-attention of that length ran over."""
    from .masks import causal_pattern

    if t.dim() != 2 or t.shape[0] != t.shape[1] or t.shape[0] < 2 or t.device.type != "cpu":
        return None
    n = int(t.shape[0])
    groups = [g for g, size in enumerate(layout.lengths) if size == n]
    marked = _marked(t)
    if not groups or marked is None:
        return None
    target = tuple(t.shape)
    if not (causal_pattern(marked, target) or causal_pattern(~marked, target)):
        return None
    if len(groups) == 1:
        return groups[0]
    selves = set()
    for use in uses:
        keys, queries = (
            _root(use.keys) if use.keys else None,
            _root(use.queries) if use.queries else None,
        )
        if keys is not None and keys is queries and tuple(use.target[-2:]) == (n, n):
            selves |= {g for g in groups if group_roots[g] is keys}
    return selves.pop() if len(selves) == 1 else None


def _read_masks(layout: Layout, found, dims, watch, group_roots) -> None:
    """Each padding mask's polarity and group, from the keys the module hid."""
    uses = list(watch.mask_uses)
    pads: dict[int, torch.Tensor] = {}
    for path, t in found:
        leaf = layout.leaves[path]
        if leaf.kind not in ("mask", "other", "ids") or t.device.type != "cpu":
            continue
        if leaf.kind in ("other", "ids") and not _binary(t):
            continue  # position ids, offsets, token ids: not a mask (OPT's 0/1 mask is
            # read by a position embedding through its cumsum, and is still a mask)
        if leaf.batch is None and len(leaf.seq) == 2:
            continue  # a [seq_q, seq_k] mask
        marked = _marked(t)
        if marked is None:
            continue
        fit = _as_padding(layout, leaf, t, marked)
        if fit is None:
            continue
        rows, seq_axis, candidates = fit
        polarity, group = _polarity(rows, candidates, uses, group_roots, layout)
        uniform = bool(rows.all()) or not bool(rows.any())
        if polarity is None and uniform:
            # No op applied it (SDPA's is_causal path skips an all-ones mask), or its
            # values tell nothing: whether it is a padding mask at all, and of which
            # sequence, is read from a retrace with one key marked (`settle_pending`).
            layout.pending.append((path, seq_axis, candidates, "keep" if rows.all() else "hide"))
            continue
        if polarity is None:
            if leaf.kind == "mask" and bool(rows.any()) and not bool(rows.all()):
                layout.polarity_unknown = layout.polarity_unknown or (
                    f"{leaf.name}: the trace saw no op hide the keys it marks, nor the others, "
                    "so its polarity (which value is padding) is unknown"
                )
            continue
        leaf.kind, leaf.polarity, leaf.padding = "mask", polarity, True
        if leaf.dtype == "float" and (_additive(t) or not _binary(t)):
            leaf.dtype = "additive"
        leaf.seq = {seq_axis: group}
        pad = rows if polarity == "hide" else ~rows
        pads[group] = pad | pads[group] if group in pads else pad
    layout.pads = pads


def _binary(t: torch.Tensor) -> bool:
    return t.numel() <= 1 << 22 and bool(((t == 0) | (t == 1)).all())


def _marked(t: torch.Tensor) -> torch.Tensor | None:
    """True where a mask's value is "marked": nonzero (bool, integer), or very negative
    (an additive float mask)."""
    if t.numel() > 1 << 22:
        return None
    if t.dtype.is_floating_point:
        if _additive(t):
            return t <= -1e4
        return t != 0 if _binary(t) else None  # a 0/1 float mask
    return t != 0


def _as_padding(layout: Layout, leaf: Leaf, t, marked):
    """(rows [batch, len], token axis, candidate groups) when `t` is a [batch, seq]-like
    mask: a batch axis, one axis of a token group's length, the others of size 1."""
    b = layout.batch_size
    if b is None or t.dim() < 2:
        return None
    batch = leaf.batch
    if batch is None and t.shape[0] == b:
        batch = 0
    if batch is None:
        return None
    others = [d for d in range(t.dim()) if d != batch and t.shape[d] > 1]
    if len(others) != 1:
        return None
    (seq_axis,) = others
    length = int(t.shape[seq_axis])
    if leaf.seq:
        candidates = [g for d, g in leaf.seq.items() if d == seq_axis]
    else:
        candidates = [g for g, n in enumerate(layout.lengths) if n == length]
    if not candidates:
        return None
    rows = marked.movedim(batch, 0).movedim(seq_axis, -1).reshape(b, length).cpu()
    leaf.batch = batch
    return rows, seq_axis, candidates


def _polarity(rows, candidates, uses, group_roots, layout):
    """("keep" or "hide", group): the polarity under which the keys the module hid from
    every query are the ones the mask marks as padding; (None, None) when no use fits."""
    length = rows.shape[-1]
    fits = []
    for use in uses:
        if use.unseen.shape[-1] != length or use.unseen.shape[0] not in (1, rows.shape[0]):
            continue
        key_root = _root(use.keys) if use.keys else None
        groups = [g for g in candidates if key_root is None or group_roots[g] is key_root]
        if key_root is not None and not groups and len(candidates) > 1:
            continue
        unseen = use.unseen.expand(rows.shape)
        for polarity, pad in (("keep", ~rows), ("hide", rows)):
            if bool((unseen == pad).all()):
                strength = 2 if bool(unseen.any()) else 0 if use.extra else 1
                fits.append((strength, polarity, (groups or candidates)[0]))
    # A use that hid some keys is evidence; one that hid none only agrees, and a mask
    # that hides nothing else (a padding mask, all ones) agrees better than a causal one.
    if fits:
        best = max(f[0] for f in fits)
        chosen = {(p, g) for strength, p, g in fits if strength == best}
        if len(chosen) == 1 and (best > 0 or len(candidates) == 1):
            return chosen.pop()
    return None, None


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
            root = _root(axis)
            if root is not None and id(root) in batch_roots:
                batch.append(d)
            elif root is not None and id(root) in group_of:
                seq[d] = group_of[id(root)]
            elif _kind(axis) == D.BATCH and int(t.shape[d]) == batch_size:
                batch.append(d)
        loose = tuple(
            d
            for d, axis in enumerate(axes)
            if d not in batch
            and d not in seq
            and int(t.shape[d]) == batch_size
            and _kind(axis) not in (D.FEATURE, D.TOKEN)
        )
        unplaced = tuple(
            d
            for d, axis in enumerate(axes)
            if d not in batch
            and d not in seq
            and int(t.shape[d]) in lengths
            and _kind(axis) != D.FEATURE
        )
        if batch or seq:
            found.append(OutLeaf(path, tuple(batch), seq, loose, unplaced))
    return found


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


def padded_once(layout: Layout, inputs, pending):
    """The inputs with the last key of example 0 marked as padding in a pending mask."""
    from .tree import rebuild

    path, seq_axis, _, polarity = pending
    leaf = layout.leaves[path]

    def mark(p, t):
        if p != path:
            return t
        t = t.clone()
        index: list[slice | int] = [slice(None)] * t.dim()
        index[leaf.batch if leaf.batch is not None else 0] = 0
        index[seq_axis] = t.shape[seq_axis] - 1
        t[tuple(index)] = 0 if polarity == "keep" else 1
        return t

    return rebuild(inputs, mark)


def settle_pending(layout: Layout, pending, retraced: Layout) -> None:
    """Take the group a pending mask pads from a retrace with one key padded."""
    path, seq_axis, candidates, polarity = pending
    found = retraced.leaves.get(path)
    if found is None or not found.padding or retraced.lengths != layout.lengths:
        return
    (group,) = set(found.seq.values())
    if group not in candidates:
        return
    leaf = layout.leaves[path]
    leaf.kind, leaf.padding, leaf.polarity = "mask", True, polarity
    leaf.seq = {seq_axis: group}
    batch = layout.batch_size or 1
    layout.pads.setdefault(group, torch.zeros(batch, layout.lengths[group], dtype=torch.bool))
