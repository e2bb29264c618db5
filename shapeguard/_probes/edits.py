"""Changed inputs for a probe: cut, taken, permuted or redrawn along batch and token axes.

Every edit goes through the layout (`layout.py`), so it reaches every per-example input
(ids, data, masks, nested in dicts and dataclasses alike) on its own axes. Token ids are
redrawn among the ids the input uses; floating data with noise of its own scale; a
padding mask is edited in its own polarity. Other inputs (position ids, a causal mask
over the tokens) are moved and cut with their tokens, never redrawn.
"""

from typing import cast

import torch

from .layout_records import Layout, Leaf
from .tree import rebuild


def take(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """`x` at `index` along `dim`, the index moved to x's device."""
    return x.index_select(dim, index.to(x.device))


def along(t: torch.Tensor, dim: int, index) -> torch.Tensor:
    """A bool tensor of t's shape, True at `index` along `dim`."""
    hit = torch.zeros(t.shape[dim], dtype=torch.bool)
    hit[torch.as_tensor(index, dtype=torch.long)] = True
    shape = [1] * t.dim()
    shape[dim] = -1
    return hit.view(shape).expand(t.shape)


def grid(t: torch.Tensor, batch: int, seq: int, cells: torch.Tensor) -> torch.Tensor:
    """A bool tensor of t's shape from `cells` [batch, seq] laid on those two axes."""
    shape = [1] * t.dim()
    shape[batch], shape[seq] = cells.shape
    view = cells.view(shape) if batch < seq else cells.t().contiguous().view(shape)
    return view.expand(t.shape)


def take_examples(layout: Layout, inputs, index: torch.Tensor):
    """The inputs of the examples at `index` (a sub-batch, or copies of one example)."""

    def cut(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or leaf.batch is None:
            return t
        return take(t, leaf.batch, index).contiguous()

    return rebuild(inputs, cut)


def sliced(layout: Layout, inputs, *, batch: int | None = None, group=None, length=None):
    """Inputs cut to the first `batch` examples, or token group `group` cut to `length`."""

    def cut(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        if batch is not None and leaf.batch is not None:
            t = t.narrow(leaf.batch, 0, batch)
        if group is not None:
            for dim, g in leaf.seq.items():
                if g == group:
                    t = t.narrow(dim, 0, length)
        return t.contiguous()  # a slice is a view; the module may .view() its input

    return rebuild(inputs, cut)


def window(layout: Layout, inputs, group: int, start: int, stop: int, *, keys_from: int = 0):
    """Token group `group` cut to positions [start, stop); a padding mask over the group
    (the keys) to [keys_from, stop): the inputs of one decode step."""

    def cut(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        for dim, g in leaf.seq.items():
            if g == group:
                lo = keys_from if leaf.padding else start
                t = t.narrow(dim, lo, stop - lo)
        return t.contiguous()

    return rebuild(inputs, cut)


def permuted(layout: Layout, inputs, perms: dict[int, torch.Tensor]):
    """Inputs with each token group's positions permuted (data, masks and positions alike)."""

    def move(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        for dim, g in leaf.seq.items():
            if g in perms:
                t = take(t, dim, perms[g])
        return t

    return rebuild(inputs, move)


def redrawn(leaf: Leaf, t: torch.Tensor, where: torch.Tensor, generator) -> torch.Tensor:
    """`t` with new values where `where` is True: other ids, or noise of t's scale."""
    where = where.to(t.device)
    if leaf.kind == "ids":
        lo, hi = leaf.ids_range or (0, int(t.max()) if t.numel() else 0)
        hi = max(hi, lo)  # an empty range never reaches randint
        new = torch.randint(lo, hi + 1, t.shape, generator=generator, dtype=t.dtype)
        if hi > lo:  # always a different id, so every redrawn token changes
            new = torch.where(new.to(t.device) == t, (new - lo + 1) % (hi - lo + 1) + lo, new)
        new = _not_pad(new.to(t.device), t, lo, hi, leaf.avoid)
        return torch.where(where, new, t)
    scale = t.detach().double().std().clamp(min=1e-3).item() if t.numel() > 1 else 1.0
    noise = torch.randn(t.shape, generator=generator, dtype=torch.float64) * scale
    return torch.where(where, noise.to(t.dtype).to(t.device), t)


def perturbed(
    layout: Layout,
    inputs,
    generator,
    *,
    example: int | None = None,
    group: int | None = None,
    positions=None,
    cells: torch.Tensor | None = None,
):
    """Inputs whose ids and data are redrawn at one example, at some positions of a
    token group, at both, or (`cells`, bool [batch, length] of `group`) at each
    example's own positions; masks and other inputs stay as they are."""

    def change(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or leaf.kind not in ("ids", "data"):
            return t
        where = torch.ones(t.shape, dtype=torch.bool)
        if example is not None:
            if leaf.batch is None:
                return t
            where &= along(t, leaf.batch, [example])
        if group is not None:
            dims = [d for d, g in leaf.seq.items() if g == group]
            if not dims:
                return t
            if cells is not None:
                if leaf.batch is None:
                    return t
                where &= grid(t, leaf.batch, dims[0], cells)
            else:
                where &= along(t, dims[0], positions)
        return redrawn(leaf, t, where, generator)

    return rebuild(inputs, change)


def _not_pad(new: torch.Tensor, old: torch.Tensor, lo: int, hi: int, avoid) -> torch.Tensor:
    """`new` ids with every id in `avoid` (a pad id, which the module may read as padding)
    replaced by the next id in [lo, hi] that is neither avoided nor the old one."""
    banned = [a for a in avoid if lo <= a <= hi]
    if not banned:
        return new
    n = hi - lo + 1
    for _ in range(len(banned) + 1):
        hit = torch.isin(new, torch.tensor(banned, dtype=new.dtype, device=new.device))
        hit |= (new == old) & (n > len(banned) + 1)
        if not bool(hit.any()):
            break
        new = torch.where(hit, (new - lo + 1) % n + lo, new)
    return new


def grown(layout: Layout, inputs, generator):
    """A batch of one grown to two: example 0, then a second example made like it (other
    ids at its real tokens, data redrawn, the same masks and other inputs), along each
    input's batch axis. Inputs without one are left as they are."""

    def grow(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or leaf.batch is None or t.shape[leaf.batch] != 1:
            return t
        other = t
        if leaf.kind in ("ids", "data"):
            where = torch.ones(t.shape, dtype=torch.bool)
            for dim, g in leaf.seq.items():
                pad = layout.padded(g)
                if pad is not None and pad.shape[-1] == t.shape[dim]:
                    where &= ~grid(t, leaf.batch, dim, pad[:1])
            other = redrawn(leaf, t, where, generator)
        return torch.cat([t, other], dim=leaf.batch)

    return rebuild(inputs, grow)


def padded(layout: Layout, inputs, group: int, cells: torch.Tensor):
    """Inputs whose padding masks over `group` also mark `cells` (bool [batch, length])
    as padding, each in its own polarity."""

    def mark(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or not leaf.padding or group not in leaf.seq.values():
            return t
        (dim,) = [d for d, g in leaf.seq.items() if g == group]
        # A padding mask is [batch, seq]: its batch axis is known (`Layout` marks it so).
        where = grid(t, cast(int, leaf.batch), dim, cells) if t.dim() > 1 else cells
        if leaf.dtype == "additive":
            value = torch.finfo(t.dtype).min
        else:
            value = 1 if leaf.polarity == "hide" else 0
        return t.masked_fill(where.to(t.device), value)

    return rebuild(inputs, mark)


def distinct_length(current: int, taken: set[int]) -> int | None:
    """A smaller size (about half) that coincides with no other size in play."""
    for t in (current // 2 + 1, *range(current - 1, 0, -1)):
        if 1 <= t < current and t not in taken:
            return t
    return None


def derangement(n: int, generator) -> torch.Tensor:
    """A random permutation of range(n) that moves every element (one n-cycle)."""
    order = torch.randperm(n, generator=generator)
    perm = torch.empty(n, dtype=torch.long)
    perm[order] = order.roll(-1)
    return perm


def sizes_in_play(layout: Layout, declared: dict) -> set[int]:
    """Every size a shorter length must not coincide with: batch, lengths, declared sizes."""
    sizes = {size for _, size in declared.values()}
    sizes.update(layout.lengths)
    if layout.batch_size:
        sizes.add(layout.batch_size)
    return sizes
