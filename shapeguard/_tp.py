"""Tensor parallelism as shapeguard reads it: from DTensor parameters and their device
mesh, never by a collective.

A module is tensor-parallel when the weights of its projections are DTensors sharded
along a mesh dim: `Shard(0)` cuts a weight's output features (column-parallel, what
`ColwiseParallel` does to q/k/v), `Shard(1)` its input features (row-parallel, the
output projection's `RowwiseParallel`). From that, the module's declared head counts and
its head size, `Sharding` knows the tp degree, the global and the local head counts and
which projection is which; the axes of this rank's local tensors are named with the local
counts (`heads=6 (12/tp2)`), and DTensor operands show their placement and local shape.

Mesh dims that belong to FSDP (fully_shard shards every parameter along dim 0) are told
apart by their name (`dp`, `fsdp`, `dp_shard`, ...) and, for unnamed meshes, by the
module being FSDP-managed: a false alarm on an FSDP model is worse than a missed TP
explanation. By the time a projection runs, FSDP2 has unsharded its weight, so what a
`linear` sees is only the TP sharding.

Pure Python at import: `torch.distributed` is looked up in `sys.modules`, never imported,
so a program that does not use it pays one dict lookup.
"""

import re
import sys
from dataclasses import dataclass, field
from fractions import Fraction

from ._names import axes as _axes

_DTENSOR: type | None = None

# Mesh dim names of data parallelism (FSDP, HSDP, DDP) and of tensor parallelism.
_DATA_DIMS = re.compile(r"^(dp|ddp|fsdp|hsdp|data|data_parallel|dp_shard|dp_replicate|dp_cp|dp_shard_cp|shard|replicate|batch)$")  # fmt: skip
_TP_DIMS = re.compile(r"(^|_)(tp|tensor|model|mp)($|_)")
# What projections are called: the query, key, value and output projections of attention.
_ROLE_NAMES = (
    ("q", re.compile(r"^(w_?q|q|query|q_proj|to_q|q_lin|linear_q|wq_a|q_linear)$", re.I)),
    ("k", re.compile(r"^(w_?k|k|key|k_proj|to_k|k_lin|linear_k|k_linear)$", re.I)),
    ("v", re.compile(r"^(w_?v|v|value|v_proj|to_v|v_lin|linear_v|v_linear)$", re.I)),
    ("o", re.compile(r"^(w_?o|o|out|o_proj|out_proj|to_out|out_lin|linear_out|dense|c_proj|proj)$", re.I)),
)  # fmt: skip


def dtensor_class() -> type | None:
    """DTensor, when `torch.distributed.tensor` is imported (None otherwise)."""
    global _DTENSOR
    if _DTENSOR is None:
        module = sys.modules.get("torch.distributed.tensor")
        if module is not None:
            _DTENSOR = getattr(module, "DTensor", None)
    return _DTENSOR


def is_dtensor(t) -> bool:
    cls = _DTENSOR if _DTENSOR is not None else dtensor_class()
    return cls is not None and isinstance(t, cls)


def role_of(name: str) -> str:
    """`q`, `k`, `v` or `o` for a projection's attribute name (`wq`, `k_proj`, ...), else ""."""
    for role, pattern in _ROLE_NAMES:
        if pattern.match(name):
            return role
    return ""


# -- placements ------------------------------------------------------------------------------
def placement_name(p) -> str:
    kind = type(p).__name__
    if kind == "Shard":
        return f"Shard({p.dim})"
    if kind == "_StridedShard":
        return f"StridedShard({p.dim}, sf={p.split_factor})"
    if kind == "Replicate":
        return "Replicate"
    if kind == "Partial":
        return f"Partial({getattr(p, 'reduce_op', 'sum')})"
    return str(p)


def mesh_dims(mesh) -> list[tuple[str, int]]:
    """(name, size) of each dim of a device mesh; unnamed dims are `mesh dim i`."""
    names = mesh.mesh_dim_names or ()
    return [
        (names[i] if i < len(names) else f"mesh dim {i}", int(mesh.size(i)))
        for i in range(mesh.ndim)
    ]


def sharding_text(t) -> str:
    """`Shard(2) on tp=2` (`, `-joined over a 2-D mesh)."""
    dims = mesh_dims(t.device_mesh)
    return ", ".join(
        f"{placement_name(p)} on {name}={size}"
        for p, (name, size) in zip(t.placements, dims, strict=False)
    )


def local_shape(t) -> tuple[int, ...]:
    """This rank's shard of a DTensor: an attribute, no op and no communication."""
    return tuple(int(s) for s in t._local_tensor.shape)


def operand_note(t) -> str:
    """What an operand line adds for a DTensor: `, DTensor Shard(2) on tp=2, local [5, 8, 96]`."""
    if not is_dtensor(t):
        return ""
    return f", DTensor {sharding_text(t)}, local {list(local_shape(t))}"


def chunk_size(n: int, parts: int, index: int) -> int:
    """How many of `n` rows part `index` of `parts` holds, as torch.chunk and `Shard` cut
    them: ceil(n / parts) each, the last ones shorter or empty."""
    full = -(-n // parts)
    start = full * index
    return max(0, min(n, start + full) - start)


def chunk_sizes(n: int, parts: int) -> list[int]:
    return [chunk_size(n, parts, i) for i in range(parts)]


# -- the sharding of an attention module --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Projection:
    """One sharded projection of an attention module."""

    name: str  # its attribute name: `wk`
    role: str  # q, k, v, o or ""
    out_features: int  # global
    in_features: int
    style: str  # "column" (Shard(0): output features cut) or "row" (Shard(1))
    mesh_dim: str
    tp: int
    rank: int  # this rank's coordinate along the mesh dim

    @property
    def local(self) -> int:
        """This rank's share of the sharded features."""
        n = self.out_features if self.style == "column" else self.in_features
        return chunk_size(n, self.tp, self.rank)

    def where(self) -> str:
        shard = 0 if self.style == "column" else 1
        return (
            f"{self.name} is {self.style}-parallel (its weight is Shard({shard}) over mesh dim "
            f"'{self.mesh_dim}' of size {self.tp})"
        )


@dataclass(frozen=True, slots=True)
class Count:
    """A head count of a sharded module: the attribute, what it says, and the truth."""

    attr: str  # n_heads
    declared: int  # what the attribute says now (the tutorial rewrites it to the local count)
    total: int  # the global count, read from the projection's global width
    tp: int

    @property
    def local(self) -> int | None:
        return self.total // self.tp if self.total % self.tp == 0 else None

    @property
    def is_local(self) -> bool:
        return self.declared != self.total and self.declared == self.local

    def note(self) -> str:
        return f"{self.total}/tp{self.tp}"


@dataclass(slots=True)
class Sharding:
    """How one attention module is split across tensor-parallel ranks."""

    tp: int
    mesh_dim: str
    rank: int
    projections: dict[str, Projection] = field(default_factory=dict)
    head_dim: int | None = None
    heads: Count | None = None
    kv_heads: Count | None = None

    def by_role(self, role: str) -> Projection | None:
        return next((p for p in self.projections.values() if p.role == role), None)

    def column(self, features: int) -> Projection | None:
        """The column-parallel projection whose local output has `features` features."""
        for p in self.projections.values():
            if p.style == "column" and p.role in ("q", "k", "v", "") and p.local == features:
                return p
        return None

    def count_of(self, projection: Projection) -> Count | None:
        if projection.role == "q":
            return self.heads
        if projection.role in ("k", "v"):
            return self.kv_heads or self.heads
        return None

    def degrees(self) -> list[int]:
        """The tp degrees that split every head count whole."""
        counts = [c.total for c in (self.heads, self.kv_heads) if c is not None]
        if not counts:
            return []
        from math import gcd

        common = 0
        for c in counts:
            common = gcd(common, c)
        return _axes.divisors(common)


def is_fsdp_managed(module) -> bool:
    """Whether FSDP2 (`fully_shard`) manages `module`: the unnamed mesh dims of its DTensor
    weights are then FSDP's, not tensor parallelism's."""
    return any(c.__name__ == "FSDPModule" for c in type(module).__mro__)


def _tp_split(weight, fsdp: bool) -> tuple[int, str, int, int] | None:
    """(sharded tensor dim, mesh dim name, size, this rank's coordinate) of the one TP
    placement of a DTensor weight; None when it has none (or several)."""
    mesh = weight.device_mesh
    dims = mesh_dims(mesh)
    found = []
    coordinate = mesh.get_coordinate() or [0] * len(dims)
    for k, p in enumerate(weight.placements):
        if type(p).__name__ != "Shard" or p.dim not in (0, 1, -1, -2):
            continue
        name, size = dims[k]
        if size <= 1 or _DATA_DIMS.match(name):
            continue
        if fsdp and not _TP_DIMS.search(name):
            continue  # an unnamed dim of an FSDP-managed module: FSDP's
        found.append((p.dim % 2, name, size, int(coordinate[k])))
    return found[0] if len(found) == 1 else None


def read_sharding(module, declared: dict, fsdp: bool = False) -> Sharding | None:
    """The tensor-parallel split of `module`, from its children's DTensor weights and the
    sizes it declares ({axis: (attribute, size)}, `_axes.declared_sizes`); None when none
    of its projections is sharded."""
    fsdp = fsdp or is_fsdp_managed(module)
    projections = {}
    for name, child in module.named_children():
        weight = getattr(child, "weight", None)
        if weight is None or not is_dtensor(weight) or weight.dim() != 2:
            continue
        split = _tp_split(weight, fsdp or is_fsdp_managed(child))
        if split is None:
            continue
        dim, mesh_dim, tp, rank = split
        out_features, in_features = (int(s) for s in weight.shape)
        projections[name] = Projection(
            name, role_of(name), out_features, in_features,
            "column" if dim == 0 else "row", mesh_dim, tp, rank,
        )  # fmt: skip
    columns = [p for p in projections.values() if p.style == "column"]
    if not columns:
        return None
    first = columns[0]
    sharding = Sharding(first.tp, first.mesh_dim, first.rank, projections)
    sharding.head_dim = _head_dim(declared)
    if sharding.head_dim:
        _read_counts(sharding, declared)
    return sharding


def _head_dim(declared: dict) -> int | None:
    found = declared.get("d_k")
    return found[1] if found is not None else None


def _read_counts(sharding: Sharding, declared: dict) -> None:
    """The global head counts, from the column-parallel projections' global widths, and
    what the attributes say (the global count, the local one, or neither)."""
    hd, tp = sharding.head_dim, sharding.tp
    if hd is None:
        return
    for projection in sharding.projections.values():
        if projection.style != "column" or projection.out_features % hd:
            continue
        total = projection.out_features // hd
        role = projection.role
        axis: str | None
        if role == "q":
            axis = "heads"
        elif role in ("k", "v"):
            axis = "kv_heads" if "kv_heads" in declared else "heads"
        elif role == "":
            axis = next(
                (a for a in ("heads", "kv_heads")
                 if a in declared and declared[a][1] in (total, Fraction(total, tp))),
                None,
            )  # fmt: skip
        else:
            continue
        if axis is None or axis not in declared or getattr(sharding, axis) is not None:
            continue
        attr, value = declared[axis]
        setattr(sharding, axis, Count(attr, value, total, tp))
    if declared.get("d_k", ("", 0))[0] == "d_model // heads":
        # shapeguard's own derivation, right only when the attribute holds the global count
        # (a tutorial-style `n_heads //= tp` makes it twice too large).
        heads = sharding.heads
        if heads is None or heads.declared != heads.total:
            sharding.head_dim = None
            sharding.heads = sharding.kv_heads = None


# -- provenance across the local/global boundary ---------------------------------------------------
def describe(split: Sharding) -> dict:
    """A sharding as the JSON report has it."""
    counts = {}
    for axis in ("heads", "kv_heads"):
        count = getattr(split, axis)
        if count is not None:
            counts[axis] = {"attribute": count.attr, "declared": count.declared,
                            "global": count.total, "local": count.local}  # fmt: skip
    return {
        "tp": split.tp,
        "mesh_dim": split.mesh_dim,
        "head_dim": split.head_dim,
        **counts,
        "projections": {
            p.name: {"style": p.style, "global": [p.out_features, p.in_features], "local": p.local}
            for p in split.projections.values()
        },
    }


# -- words ---------------------------------------------------------------------------------------
def heads_text(features: int, head_dim: int, what: str) -> str:
    """`half a kv head`, `1.5 heads`, `2 heads` for `features` features of heads of `head_dim`."""
    share = Fraction(features, head_dim)
    noun = f"{what} head" if what else "head"
    if share == 1:
        return f"one {noun}"
    if share.denominator == 1:
        return f"{share.numerator} {noun}s"
    if share < 1:
        if share == Fraction(1, 2):
            return f"half a {noun}"
        return f"{share.numerator}/{share.denominator} of a {noun}"
    return f"{float(share):.3g} {noun}s"


def join(items: list) -> str:
    items = [str(i) for i in items]
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]
