"""Index maps of dims, for `head_layout`: each head permutation carried back to the
rows of the projection it came from (`_lift`: through each cut, to the dim the
projection's weight has), and the checks that every permuted dim is reached once."""

import torch

from .._names import dims as D
from .head_plan import PlanState, Refused, key_of
from .head_sites import Site


def dim_maps(state: PlanState) -> dict[int, torch.Tensor]:
    """Per dim, the index map its factors' permutations make (new = old[map]), carried
    back through every cut to the dim the projection's weight has; checked."""
    maps: dict[int, torch.Tensor] = {}
    dims: dict[int, D.Dim] = {}
    for key, (root, stride, size) in state.atoms.items():
        sigma = state.sigma[key]
        base = torch.arange(root.size)
        digit = (base // stride) % size
        m = base + (sigma[digit] - digit) * stride
        dim = root
        for _ in range(16):
            dims[id(dim)] = dim
            before = maps.get(id(dim))
            maps[id(dim)] = m if before is None else union_map(before, m)
            if dim.cut is None:
                break
            m, dim = _lift(dim, m)
    for key, (root, stride, size) in state.atoms.items():
        _check(root, stride, size, state.sigma[key], maps, dims)
    return maps


def union_map(before: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Two index maps of one dim as one: each moves its own rows (Q's, K's and V's of a
    packed projection), and rows both move must move alike (a layer called twice cuts
    its projection anew: the same permutation again, not applied twice). Where they
    disagree, composed (`_check` refuses what does not hold)."""
    identity = torch.arange(len(m))
    moved = m != identity
    both = moved & (before != identity)
    if not bool(torch.equal(before[both], m[both])):
        return before[m]
    out = before.clone()
    out[moved] = m[moved]
    return out


def _lift(dim: D.Dim, m: torch.Tensor) -> tuple[torch.Tensor, D.Dim]:
    """An index map of a cut dim as the index map of the dim it was cut from."""
    if dim.cut is None:
        raise ValueError("only a cut dim lifts to the dim it was cut from")
    (parent, stride, size), kept = dim.cut
    parent = parent.find()
    pos = torch.as_tensor(list(kept), dtype=torch.long)
    inverse = torch.full((size,), -1, dtype=torch.long)
    inverse[pos] = torch.arange(len(pos))
    base = torch.arange(parent.size)
    digit = (base // stride) % size
    i = inverse[digit]
    moved = pos[m[i.clamp(min=0)]]
    return torch.where(i >= 0, base + (moved - digit) * stride, base), parent


def coords_in(dim: D.Dim, target: D.Dim) -> torch.Tensor | None:
    """For each index of `target` (an ancestor of `dim` through cuts), its index along
    `dim` (-1 where `dim` does not reach)."""
    if dim is target:
        return torch.arange(dim.size)
    if dim.cut is None:
        return None
    (parent, stride, size), kept = dim.cut
    above = coords_in(parent.find(), target)
    if above is None:
        return None
    pos = torch.as_tensor(list(kept), dtype=torch.long)
    inverse = torch.full((size,), -1, dtype=torch.long)
    inverse[pos] = torch.arange(len(pos))
    digit = (above.clamp(min=0) // stride) % size
    return torch.where(above >= 0, inverse[digit], torch.full_like(above, -1))


def _check(root, stride, size, sigma, maps, dims) -> None:
    """Each factor's permutation holds in the map of its dim and of every dim above."""
    dim = root
    for _ in range(16):
        m = maps.get(id(dim))
        c = coords_in(root, dim)
        if m is not None and c is not None:
            moved = c[m]
            inside = c >= 0
            d, d2 = (c // stride) % size, (moved // stride) % size
            ok = bool((moved[~inside] < 0).all()) and bool((moved[inside] >= 0).all())
            ok = ok and bool((d2[inside] == sigma[d[inside]]).all())
            if not ok:
                raise Refused(
                    f"{root.origin or 'a heads axis'}: its heads cannot be permuted "
                    "consistently with the others of the same projection"
                )
        if dim.cut is None:
            break
        dim = dim.cut[0][0].find()


def clash(state: PlanState, maps, watch, skipped: list[Site]) -> None:
    """A permuted projection output must not also be what a projection contracts (the
    model's features), nor feed an attention op left as it was."""
    permuted = {k for k in maps if k in state.roots}
    if permuted & set(state.columns):
        raise Refused("a projection's output rows are also the columns it reads as heads")
    for dim in watch.contracted:
        if id(dim.find()) in permuted:
            raise Refused(
                f"{dim.find().origin}: the heads' rows are also features another projection "
                "reads, so permuting them would change more than the heads"
            )
    for site in skipped:
        for o in site.operands:
            for axis in o.lead:
                for atom in axis:
                    top = top_dim(atom[0].find())
                    if top is not None and id(top) in permuted:
                        raise Refused(
                            f"{site.where}: its heads come from a projection another attention "
                            "op permutes, but the trace cannot read its own"
                        )


def unreached(state: PlanState, maps, joins) -> None:
    """Every tensor that meets a permuted heads axis in an elementwise op or a join (a
    gate, a value residual, a positional query concatenated per head) must be permuted
    with it: made from the permuted projections too, or the same for every head (a
    broadcast, a copy, batch or tokens). A per-head term from anything else (another
    projection, a table, the input's features) keeps its order: permuting the heads is
    no symmetry of the module as the probe can apply it."""
    for join in joins:
        for pos in range(join.rank):
            if pos == join.skip:
                continue
            moved, kept = False, False
            for axes, sizes in join.operands:
                k = pos - (join.rank - len(axes))
                if k < 0 or sizes[k] == 1:
                    continue
                atoms = axes[k]
                if any(_moved(atom, state, maps) for atom in atoms):
                    moved = True
                elif any(_per_head(atom) for atom in atoms):
                    kept = True
            if moved and kept:
                raise Refused(
                    f"{join.where}: the heads meet a term of their own that the permutation "
                    "does not reach (made by another projection, a table or the input, not "
                    "by the projections whose rows are permuted): a per-head gate, value "
                    "residual or positional query"
                )


def _source(atom):
    """The dim an atom was cut from, followed through cuts and line-ups from the atom's
    own dim (not its union's root: a dim lined up with a head factor keeps its origin)."""
    dim = atom[0]
    for _ in range(16):
        if dim.cut is not None:
            dim = dim.cut[0][0]
        elif dim.alias is not None and D.is_whole(atom):
            atom = dim.alias
            dim = atom[0]
        else:
            break
    return dim


def _moved(atom, state: PlanState, maps) -> bool:
    """Whether the plan permutes this atom: it is a heads factor the plan chose an order
    for, and the projection rows it came from are the ones permuted (a factor only
    lined up with those heads, from another projection, is not)."""
    if key_of(atom) not in state.sigma:
        return False
    source = _source(atom)
    return id(source) in maps or id(source.find()) in maps


def _per_head(atom) -> bool:
    """An atom that differs from head to head (not a broadcast copy, batch or tokens)."""
    root = atom[0].find()
    return root.kind not in (D.COPY, D.BATCH, D.TOKEN)


def top_dim(dim: D.Dim, depth: int = 0):
    if depth > 8:
        return None
    if dim.cut is not None:
        return top_dim(dim.cut[0][0].find(), depth + 1)
    return dim


def index_of(axis, state: PlanState, maps) -> torch.Tensor | None:
    """The permutation of one parameter axis (a whole dim), if it is a permuted one."""
    if len(axis) != 1 or not D.is_whole(axis[0]):
        return None
    root = axis[0][0].find()
    index = maps.get(id(root))
    if index is None:
        index = state.columns.get(id(root))
    if index is None and root.alias is not None:
        sigma = state.sigma.get(key_of(root.alias))
        if sigma is not None and len(sigma) == root.size:
            index = sigma
    if index is None or torch.equal(index, torch.arange(len(index))):
        return None
    return index
