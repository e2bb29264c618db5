"""The masks among the inputs, for `layout.read_layout`: each padding mask's polarity
and token group, read from the keys the module hid; a square causal mask; axes named
by size; and the retrace that settles a mask no op applied."""

import torch

from .._names import dims as D
from .layout_records import Layout, Leaf, axis_kind, root_of


def is_additive_mask(t: torch.Tensor) -> bool:
    """A float mask: 0 where a key is kept and very negative where it is hidden."""
    if t.device.type != "cpu" or t.numel() > 1 << 22 or t.dim() < 2:
        return False
    hidden = t <= -1e4
    return bool(hidden.any()) and bool(((t == 0) | hidden).all())


def by_size(layout: Layout, leaf: Leaf, t: torch.Tensor, axes, uses, group_roots) -> None:
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
        kind = axis_kind(axes[d]) if axes[d] else None
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
        elif (leaf.kind == "mask" or is_binary(t)) and leaf.batch is not None:
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
            root_of(use.keys) if use.keys else None,
            root_of(use.queries) if use.queries else None,
        )
        if keys is not None and keys is queries and tuple(use.target[-2:]) == (n, n):
            selves |= {g for g in groups if group_roots[g] is keys}
    return selves.pop() if len(selves) == 1 else None


def read_masks(layout: Layout, found, dims, watch, group_roots) -> None:
    """Each padding mask's polarity and group, from the keys the module hid."""
    uses = list(watch.mask_uses)
    pads: dict[int, torch.Tensor] = {}
    for path, t in found:
        leaf = layout.leaves[path]
        if leaf.kind not in ("mask", "other", "ids") or t.device.type != "cpu":
            continue
        if leaf.kind in ("other", "ids") and not is_binary(t):
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
        if leaf.dtype == "float" and (is_additive_mask(t) or not is_binary(t)):
            leaf.dtype = "additive"
        leaf.seq = {seq_axis: group}
        pad = rows if polarity == "hide" else ~rows
        pads[group] = pad | pads[group] if group in pads else pad
    layout.pads = pads


def is_binary(t: torch.Tensor) -> bool:
    return t.numel() <= 1 << 22 and bool(((t == 0) | (t == 1)).all())


def _marked(t: torch.Tensor) -> torch.Tensor | None:
    """True where a mask's value is "marked": nonzero (bool, integer), or very negative
    (an additive float mask)."""
    if t.numel() > 1 << 22:
        return None
    if t.dtype.is_floating_point:
        if is_additive_mask(t):
            return t <= -1e4
        return t != 0 if is_binary(t) else None  # a 0/1 float mask
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
        key_root = root_of(use.keys) if use.keys else None
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
