"""Which input axes are batch and seq, as the probes read the inputs."""

from dataclasses import dataclass, field

import torch

from .tree import leaves


@dataclass(slots=True)
class Leaf:
    """One tensor among the inputs: where it sits, what it is, which axes are which."""

    path: tuple
    name: str
    kind: str  # "data" (token features), "mask", "other" (cos/sin, positions, ...)
    batch: int | None = None
    seq: dict[int, int] = field(default_factory=dict)  # axis -> seq group


def _kind(name: str, t: torch.Tensor) -> str:
    """ "mask" (bool, integer, named so, or an additive 0 / -inf float mask), "other" for
    positional inputs (cos, sin, position tables: moved with their tokens, never
    redrawn), else "data"."""
    if t.dtype == torch.bool or not t.is_floating_point() or "mask" in name.lower():
        return "mask"
    if positional_name(name):
        return "other"
    if t.device.type != "cpu" or t.numel() > 1 << 22 or t.dim() < 2:
        return "data"
    additive = bool(((t == 0) | (t <= -1e4)).all()) and bool((t <= -1e4).any())
    return "mask" if additive else "data"


@dataclass(slots=True)
class Layout:
    """Batch size, seq groups and each leaf's axes, as the probes see the inputs."""

    batch_size: int | None
    lengths: list[int]  # length of each seq group; group 0 holds the queries
    leaves: dict[tuple, Leaf]
    ambiguous: str = ""  # why some axes cannot be told apart, if they cannot
    batch_dim: int = 0
    seq_dim: int = 1


def read_layout(model, args: tuple, kwargs: dict, names: list[str]) -> Layout | str:
    """Find batch and seq axes: the first floating input with 3 or more axes is
    [batch, seq, features] ([seq, batch, features] for a module built with
    batch_first=False); other inputs are matched by their sizes."""
    found = leaves((args, kwargs))
    name_of = {p: names[i] if i < len(names) else _path_name(p) for i, (p, _) in enumerate(found)}
    kinds = {p: _kind(name_of[p], t) for p, t in found}
    primary = next(((p, t) for p, t in found if kinds[p] == "data" and t.dim() >= 3), None)
    if primary is None:
        return "no input is [batch, seq, features]: the probes need one"
    batch_dim, seq_dim = (1, 0) if _seq_first(model) else (0, 1)
    p_shape = primary[1].shape
    batch_size = int(p_shape[batch_dim])
    lengths = [int(p_shape[seq_dim])]
    layout = Layout(batch_size, lengths, {}, batch_dim=batch_dim, seq_dim=seq_dim)
    for path, t in found:
        kind = kinds[path]
        leaf = Leaf(path, name_of[path], kind)
        if kind == "data" and t.dim() >= 3 and t.shape[batch_dim] == batch_size:
            # Another token input: keys and values, or a memory of its own length.
            length = int(t.shape[seq_dim])
            if length not in lengths:
                lengths.append(length)
            leaf.batch, leaf.seq = batch_dim, {seq_dim: lengths.index(length)}
        else:
            leaf.kind = "other" if kind == "data" else kind
            _match_by_size(layout, leaf, t)
        layout.leaves[path] = leaf
    return layout


def _match_by_size(layout: Layout, leaf: Leaf, t: torch.Tensor) -> None:
    """Axes of a mask (all of them) or of a cos/sin-like input (all but the last) named
    by size; a size shared by batch and a seq group, or by two groups, is ambiguous."""
    dims = range(t.dim()) if leaf.kind == "mask" else range(t.dim() - 1)
    known = [layout.batch_size, *layout.lengths]
    if (
        leaf.kind == "mask"
        and t.dim() == 2
        and tuple(t.shape) == (known[0], known[1]) == (known[1], known[0])
    ):
        # batch == seq: a triangle is [seq_q, seq_k], anything else a [batch, seq] padding mask.
        if _triangular(t):
            leaf.seq = {0: 0, 1: 0}
        else:
            leaf.batch, leaf.seq = 0, {1: 0}
        return
    for d in dims:
        size = int(t.shape[d])
        if size == 1 or size not in known:
            continue
        if known.count(size) > 1:
            layout.ambiguous = (
                f"{leaf.name} {list(t.shape)}: batch and seq (or two sequences) are both "
                f"{size}, so its axes cannot be told apart; use distinct sizes"
            )
            continue
        if size == layout.batch_size and leaf.batch is None and not leaf.seq:
            leaf.batch = d
        elif size in layout.lengths:
            leaf.seq[d] = layout.lengths.index(size)


def _triangular(t: torch.Tensor) -> bool:
    from ..checks.mask_semantics import triangle

    hidden = t <= -1e4 if t.is_floating_point() and bool((t < 0).any()) else t != 0
    return bool(triangle(hidden) or triangle(~hidden))


def _seq_first(model) -> bool:
    for module in (model, getattr(model, "self_attn", None)):
        if module is not None and getattr(module, "batch_first", True) is False:
            return True
    return False


def _path_name(path: tuple) -> str:
    return ".".join(str(p) for p in path[1:]) or "input"


def positional_name(name: str) -> bool:
    """`position_embeddings.0`, `cos`, `freqs_cis`: an input that encodes positions."""
    lowered = name.lower()
    return any(w in lowered for w in ("position", "pos_", "cos", "sin", "rotary", "rope", "freqs"))
