"""Where a decode or chunked-prefill step's queries sit among its keys, from how the keys
were assembled.

A cached step attends its new queries to the cached keys joined with the new ones, so the
key axis is a fresh one (`torch.cat` makes a new dim) that provenance does not tie to the
queries' axis, and `own_keys` finds no query's own key there. The concatenation is
structural, though: `Dim.joined` keeps its parts in order, so the cached keys are the
first parts (`[0..P)`, the positions before the step) and the step's own keys follow
(`[P..P+n)`). A part is the queries' own where provenance ties it to the queries' axis
(a chunk of `n >= 2` tokens: the same axis, or a slice of one). A one-token step has no
axis to tie (a size-1 axis carries no identity): there the key axis must be a
concatenation whose last part is that one key, the layout every cat cache makes
(`torch.cat([past, new], dim=seq)`), and nothing else is read from sizes.

Where the key axis is no such concatenation (a preallocated buffer indexed by
`cache_position`, an unknown cache), nothing is established and no claim is made.
"""

from .._names import dims as D

# How many slices of slices are followed back to the concatenation they were cut from.
_DEPTH = 8


def own_at_step(
    queries: D.Axis, keys: D.Axis, seq_q: int, seq_k: int
) -> tuple[list[int], str] | None:
    """(for each of the `seq_q` queries, the index of its own key among the `seq_k` keys;
    the evidence in words), where the keys are cached keys joined with the step's own;
    None where the structure does not say so."""
    found = _joined_positions(keys, seq_k)
    if found is None:
        return None
    parts, kept = found
    offsets, start = [], 0
    for part in parts:
        offsets.append(start)
        start += D.size_of(part)
    last = len(parts) - 1
    q = D.normalize(queries)
    own_part: int | None = None
    mapping: list[int] = []
    if q:
        for i, part in enumerate(parts):
            if D.normalize(part) == q and D.size_of(part) == seq_q:
                own_part, mapping = i, list(range(seq_q))
                break
    elif seq_q == 1 and last > 0 and not D.normalize(parts[last]) and D.size_of(parts[last]) == 1:
        own_part, mapping = last, [0]
    if own_part is None or offsets[own_part] == 0:
        return None  # no cached keys before the step's own: not a cached step
    index = {position: j for j, position in enumerate(kept)}
    own = [index.get(offsets[own_part] + m, -1) for m in mapping]
    if all(o < 0 for o in own):
        return None
    cached = offsets[own_part]
    evidence = (
        f"the keys are {cached} cached keys joined with the step's {seq_q} new "
        f"{'key' if seq_q == 1 else 'keys'} (torch.cat)"
    )
    return own, evidence


def _joined_positions(keys: D.Axis, seq_k: int) -> tuple[tuple[D.Axis, ...], list[int]] | None:
    """(the parts of the concatenation the key axis was cut from, the positions of that
    concatenation it holds in order), following slices back; None where it is none."""
    axis = D.normalize(keys)
    if len(axis) != 1:
        return None
    root, stride, n = axis[0]
    if stride != 1 or n != seq_k:
        return None
    positions: list[int] = list(range(n))
    for _ in range(_DEPTH):
        if root.joined is not None and root.size == n:
            return root.joined, positions
        cut = root.cut
        if cut is None or root.size != n:
            return None
        (parent, p_stride, p_size), kept = cut
        if p_stride != 1 or len(kept) != n or any(not 0 <= p < len(kept) for p in positions):
            return None
        positions = [kept[p] for p in positions]
        root, n = parent.find(), p_size
        if root.size != n:
            return None
    return None


def padding_at_step(call, inputs, reach, lead_dims, own, specs, read):
    """(per example, True where a key is padding; the mask's name; True where its value says
    padding; the reach's leading axis of the examples, None where alike) at a cached step
    whose own keys are the last `seq_q` (`own_at_step`), from a root padding mask as the
    model's API documents it with a cache: one column per cached and new token
    (`[batch, past + new]`, beside `input_ids` of `[batch, new]`), so its columns are the
    keys. `specs` are intent's (mask name, main inputs, True = padding) and `read` its
    reader of a mask's values (bool rows, or None). None where nothing ties them."""
    seq_q, seq_k = reach.seq_q, reach.seq_k
    if list(own) != list(range(seq_k - seq_q, seq_k)):
        return None
    for mask_name, mains, true_pads in specs:
        mask = inputs.get(mask_name)
        if mask is None or mask.dim() != 2 or int(mask.shape[1]) != seq_k:
            continue
        beside = [
            main
            for main in (inputs.get(name) for name in mains)
            if main is not None
            and main.dim() >= 2
            and tuple(main.shape[:2]) == (int(mask.shape[0]), seq_q)
        ]
        values = read(mask) if beside else None
        if values is None:
            continue
        pads = tuple(tuple(v if true_pads else not v for v in row) for row in values)
        if all(row == pads[0] for row in pads):
            return (pads[0],), mask_name, true_pads, None
        axis = _batch_axis(call, reach, lead_dims, [mask, *beside], len(pads))
        if axis is None:
            return None
        return pads, mask_name, true_pads, axis
    return None


def _batch_axis(call, reach, lead_dims, tensors, batch: int) -> int | None:
    """The reach's leading axis that is the inputs' batch axis, by identity."""
    wanted = []
    for tensor in tensors:
        meta = call.meta(tensor)
        if meta is not None and len(meta.dims) == tensor.dim():
            wanted.append(D.normalize(meta.dims[0]))
    for i, axis in enumerate(lead_dims):
        if reach.lead[i] == batch and D.normalize(axis) in wanted:
            return i
    return None
