"""Changed inputs for a probe: cut, permuted or redrawn along the batch and seq axes."""

import torch

from .layout import Layout
from .tree import rebuild


def take(x: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """`x` at `index` along `dim`, the index moved to x's device."""
    return x.index_select(dim, index.to(x.device))


def sliced(
    layout: Layout,
    inputs,
    *,
    batch: int | None = None,
    group: int | None = None,
    length: int | None = None,
):
    """Inputs cut to the first `batch` examples, or group `group` cut to `length`."""

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


def permuted(layout: Layout, inputs, perms: dict[int, torch.Tensor]):
    """Inputs with each seq group's positions permuted (data, masks and positions alike)."""

    def move(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None:
            return t
        for dim, g in leaf.seq.items():
            if g in perms:
                t = take(t, dim, perms[g])
        return t

    return rebuild(inputs, move)


def perturbed(
    layout: Layout,
    inputs,
    generator,
    *,
    example: int | None = None,
    group: int | None = None,
    positions: torch.Tensor | None = None,
):
    """Inputs whose data values are redrawn at one example, at some positions of a seq
    group, or at both; masks and positional inputs stay as they are."""

    def change(path, t):
        leaf = layout.leaves.get(path)
        if leaf is None or leaf.kind != "data":
            return t
        where = torch.ones(t.shape, dtype=torch.bool)
        if example is not None:
            if leaf.batch is None:
                return t
            where &= along(t, leaf.batch, torch.tensor([example]))
        if group is not None:
            dims = [d for d, g in leaf.seq.items() if g == group]
            if not dims:
                return t
            where &= along(t, dims[0], positions)
        noise = torch.randn(t.shape, generator=generator, dtype=t.dtype) * t.std().clamp(min=1e-3)
        return torch.where(where.to(t.device), noise.to(t.device), t)

    return rebuild(inputs, change)


def along(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """A bool tensor of t's shape, True at `index` along `dim`."""
    hit = torch.zeros(t.shape[dim], dtype=torch.bool)
    hit[index] = True
    shape = [1] * t.dim()
    shape[dim] = -1
    return hit.view(shape).expand(t.shape)


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
