"""Shape arithmetic and the sizes a module declares (d_model, heads, kv_heads, d_k).

How views group axes, broadcasting, divisors, and how a named shape is written. What an
axis *is* comes from data flow (`shapeguard._names`), not from here. Pure Python: shapes
are tuples of ints.
"""

from collections.abc import Iterable, Sequence
from math import prod

# A shape's axis names, one per axis (None: unnamed); `dims.Axis` is an axis's provenance.
AxisNames = tuple[str | None, ...]

# Attribute names that declare a size, per axis name. Order matters: first hit wins.
ATTRIBUTE_AXES: dict[str, tuple[str, ...]] = {
    "d_model": ("d_model", "embed_dim", "hidden_size", "n_embd", "dim", "d_embed", "model_dim"),
    "heads": ("n_heads", "num_heads", "num_attention_heads", "n_head", "nhead", "heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "n_kv_head"),
    "d_k": ("d_k", "head_dim", "d_head", "head_size", "dim_head", "attention_head_size"),
}


# Every name above: what an object's dicts are intersected with before any is read.
SIZE_ATTRIBUTES = frozenset(name for names in ATTRIBUTE_AXES.values() for name in names)


def _named_here(own: object, cls: type) -> frozenset | None:
    """The names of `SIZE_ATTRIBUTES` that the instance dict or the class's MRO dicts hold (a
    name held nowhere reads as None), or None when that cannot be told so (a metaclass
    other than `type`, whose own attributes a class lookup also finds)."""
    if type(own) is not dict or type(cls) is not type:
        return None
    # keys() & names: the intersection walks the 23 names, not the dict (nn.Module's has
    # over a hundred keys); `object`, which cannot be given attributes, is skipped.
    found = own.keys() & SIZE_ATTRIBUTES
    for klass in cls.__mro__[:-1]:
        found |= klass.__dict__.keys() & SIZE_ATTRIBUTES
    return frozenset(found)


def _int_attr(
    obj: object, names: Iterable[str], held: frozenset | None = None
) -> tuple[str, int] | None:
    # The instance dict, then the class: a plain getattr of a missing name would go
    # through nn.Module.__getattr__ and an AttributeError per name, on every forward.
    # `held` (`_named_here`): the names there are, so the missing ones cost no lookup.
    own = getattr(obj, "__dict__", {})
    cls = type(obj)
    for name in names:
        if held is not None and name not in held:
            continue
        value = own.get(name)
        if value is None:
            value = getattr(cls, name, None)
            if isinstance(value, property):
                # `@property def head_dim(self)`: the size the instance reports, as a
                # contract binding it reads it (one reader, one answer).
                try:
                    value = getattr(obj, name)
                except Exception:  # a property that cannot answer declares nothing
                    value = None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def declared_sizes(module: object) -> dict[str, tuple[str, int]]:
    """Sizes a module declares, as {axis: (attribute, size)}; also reads `module.config`."""
    found: dict[str, tuple[str, int]] = {}
    sources = [module]
    config = getattr(module, "config", None)
    if config is not None:
        sources.append(config)
    # Each source with the names it holds; one that holds none is not read at all.
    readers = []
    for source in sources:
        held = _named_here(getattr(source, "__dict__", {}), type(source))
        if held is None or held:
            readers.append((source, held))
    if not readers:
        return found
    for axis, names in ATTRIBUTE_AXES.items():
        for source, held in readers:
            hit = _int_attr(source, names, held)
            if hit is not None:
                found[axis] = hit
                break
    if "d_k" not in found and "d_model" in found and "heads" in found:
        d_model, heads = found["d_model"][1], found["heads"][1]
        if d_model % heads == 0:
            found["d_k"] = ("d_model // heads", d_model // heads)
    return found


def format_shape(
    shape: Sequence[int], axes: AxisNames | None = None, notes: dict | None = None
) -> str:
    """`[batch=2, heads=8, seq=16, d_k=64]`; unnamed axes show their size alone. `notes`
    add to a name of a given size: {("heads", 6): "12/tp2"} gives `heads=6 (12/tp2)`."""
    if axes is None or len(axes) != len(shape):
        axes = (None,) * len(shape)
    parts = [
        f"{name}={size}" if name else str(size) for name, size in zip(axes, shape, strict=True)
    ]
    if notes:
        for i, (name, size) in enumerate(zip(axes, shape, strict=True)):
            note = notes.get((name, size)) if name else None
            if note:
                parts[i] += f" ({note})"
    return "[" + ", ".join(parts) + "]"


def axis_label(axes: AxisNames | None, dim: int, ndim: int) -> str:
    """The name of axis `dim`, or `dim N` when it has none."""
    dim = dim % ndim if ndim else dim
    if axes and len(axes) == ndim:
        name = axes[dim]
        if name:
            return name
    return f"dim {dim - ndim}"


def resolve_view_shape(numel: int, target: Sequence[int]) -> tuple[int, ...] | None:
    """The target shape with -1 filled in, or None when it cannot hold `numel` elements."""
    known = prod(s for s in target if s != -1)
    if list(target).count(-1) > 1:
        return None
    if -1 in target:
        if known == 0 or numel % known:
            return None
        return tuple(numel // known if s == -1 else s for s in target)
    return tuple(target) if known == numel else None


def view_groups(src: Sequence[int], dst: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of source axes with runs of target axes of equal product.

    `[2, 5, 33] -> [2, 5, 3, 11]` gives `[([0], [0]), ([1], [1]), ([2], [2, 3])]`.
    Size-1 axes join the neighbouring group. None when the shapes do not line up.
    """
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        gi: list[int] = []
        gj: list[int] = []
        pi = pj = 1
        if i < len(src):
            gi.append(i)
            pi *= src[i]
            i += 1
        if j < len(dst):
            gj.append(j)
            pj *= dst[j]
            j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i)
                pi *= src[i]
                i += 1
            elif j < len(dst):
                gj.append(j)
                pj *= dst[j]
                j += 1
            else:
                return None
        # Fold trailing size-1 axes into this group so the next group starts clean.
        while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            gi.append(i)
            i += 1
        while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            gj.append(j)
            j += 1
        groups.append((gi, gj))
    return groups


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """NumPy broadcasting of shapes, or None when they do not broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for k, size in enumerate(shape):
            pos = ndim - len(shape) + k
            if size == 1:
                continue
            if out[pos] not in (1, size):
                return None
            out[pos] = size
    return tuple(out)


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first axis (negative index) at which a and b fail to broadcast."""
    for k in range(1, min(len(a), len(b)) + 1):
        x, y = a[-k], b[-k]
        if x != y and x != 1 and y != 1:
            return -k
    return None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
