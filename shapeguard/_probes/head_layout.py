"""Which rows of which parameters make each head: read from the trace's axis provenance.

At every attention op (`head_sites.Site`) the axes in front of Q's, K's and V's [seq,
features] are lined up position by position: their atoms that are factors of a
projection's output (directly, through the slices, splits and indices that cut it, or
through a dim lined up with one) are the heads; batch and token atoms stay where they
are; broadcast copies (kv heads repeated for their queries) follow whatever the query
heads do. One permutation of the head positions is drawn per site (a derangement of
each factor, so every head moves and each kv group keeps its queries), and each atom
gets the permutation of its own digit. That permutation is carried back to the rows
of the projection the atom came from (`_lift`: through each cut, to the dim the
projection's weight has), whatever the layout: separate Q/K/V projections, one packed
[Q | K | V], per-head interleaved (GPT-NeoX, BLOOM), grouped [kv groups, queries + 2,
d_k] (Falcon), mp_num-blocked (CodeGen), or low-rank latents whose heads appear only
after the up-projection (DeepSeek's MLA).

The context is followed to the projections that read it; the columns they contract
are permuted by the same digits, read from the provenance of that axis (or, when the
merge lost it, as a correct merge lays them out: [heads, d_v]). Every parameter axis
whose dim is one of those permuted dims is permuted with it, and so is a parameter an
op applies along such a dim (a Linear's bias, a norm's weight over the whole projection
output). Nothing is taken from parameter names or from sizes that happen to coincide.
"""

from dataclasses import dataclass, field

import torch

from .._names import dims as D
from .edits import derangement
from .head_sites import Site

Key = tuple[int, int, int]  # (id of a root dim, stride, size): one factor of a dim


@dataclass(slots=True)
class Plan:
    """Head permutations as index permutations of parameter axes (new = old[index])."""

    params: dict[str, list[tuple[int, torch.Tensor]]] = field(default_factory=dict)
    outputs: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # of the output
    described: list[str] = field(default_factory=list)  # "4 heads of model.layers.0.attn"
    # Where the trace lost the heads (a split or merge that mixes them with the tokens):
    # those rows or columns were permuted as a correct split or merge lays them out.
    assumed: list[str] = field(default_factory=list)


class _Refused(Exception):
    """A site whose heads cannot be permuted, and why."""


@dataclass(slots=True)
class _Atom:
    atom: tuple
    lo: int  # its stride within the axis (the product of the sizes inside it)
    kind: str  # "head", "fixed" (batch, tokens), "free" (a broadcast copy), "unknown"


@dataclass(slots=True)
class _Digit:
    pos: int  # the aligned leading axis
    lo: int  # its stride within that axis
    size: int
    head: bool
    sigma: torch.Tensor | None = None


class _State:
    """The permutations chosen so far: per factor of a dim, and per dim its index map."""

    def __init__(self, roots: set[int], entangled: dict | None = None) -> None:
        self.roots = roots  # ids of the dims of parameter axes
        self.entangled = entangled or {}  # head_sites.HeadWatch.entangled
        self.assumed: list[str] = []  # see Plan.assumed
        self.sigma: dict[Key, torch.Tensor] = {}
        # The same factors by the projection rows they cover (`_canon`): a layer called
        # twice (shared across depth) cuts its projection anew each time, into new dims.
        self.canon: dict[tuple, torch.Tensor] = {}
        self.atoms: dict[Key, tuple] = {}
        self.dims: dict[int, D.Dim] = {}
        self.columns: dict[int, torch.Tensor] = {}  # id of a weight's input dim -> index
        self.output: list[tuple[int, torch.Tensor]] = []


def plan_heads(watch, generator: torch.Generator) -> Plan | tuple[str, bool]:
    """The head permutation of every site the trace can read back to its projections,
    or (why there is none, whether the probe applies at all)."""
    roots = {id(atom[0].find()) for axes in watch.params.values() for a in axes for atom in a}
    state = _State(roots, watch.entangled)
    plan = Plan()
    why = ""
    done: list[Site] = []
    skipped: list[Site] = []
    for site in watch.sites:
        trial = _copy(state)
        try:
            heads = _site(site, trial, generator, watch.out_axes)
        except _Refused as error:
            why = why or str(error)
            skipped.append(site)
            continue
        if heads < 2:
            continue
        state = trial
        done.append(site)
        name = f"{heads} heads of {site.name or type(site.module).__name__}"
        if site.module is None:
            name = f"{heads} heads at {site.where}"
        if name not in plan.described:
            plan.described.append(name)
    if not done:
        if why:
            return why, True
        if not watch.sites:
            return "the trace saw no attention op (a query-key product or SDPA)", False
        return "every attention op runs one head: there are no heads to permute", False
    try:
        maps = _maps(state)
        _clash(state, maps, watch, skipped)
        _unreached(state, maps, watch.joins)
    except _Refused as error:
        return str(error), True
    for name, axes in watch.params.items():
        for axis, ax in enumerate(axes):
            index = _index_of(ax, state, maps)
            if index is not None:
                plan.params.setdefault(name, []).append((axis, index))
    for name, dim in watch.paired.items():
        index = maps.get(id(dim.find()))
        if index is not None and name not in plan.params and len(index) > 1:
            plan.params[name] = [(0, index)]
    plan.outputs = state.output
    plan.assumed = state.assumed
    return plan


def _copy(state: _State) -> _State:
    new = _State(state.roots, state.entangled)
    new.assumed = list(state.assumed)
    new.sigma, new.atoms, new.dims = dict(state.sigma), dict(state.atoms), dict(state.dims)
    new.canon = dict(state.canon)
    new.columns, new.output = dict(state.columns), list(state.output)
    return new


# -- one site -------------------------------------------------------------------------------
def _site(site: Site, state: _State, generator, out_axes) -> int:
    """Choose the site's head permutation and note it in `state`; the number of heads."""
    if len(site.operands) < 3:
        raise _Refused(f"{site.where}: the trace saw no product of its attention with V")
    if site.mixed:
        raise _Refused(
            f"{site.where}: its context meets another tensor at {site.mixed} before any "
            "projection reads it, so its columns are not the heads' alone"
        )
    n = max(len(o.lead) for o in site.operands)
    digits: list[_Digit] = []
    covers: list[tuple[int, _Atom, list[_Digit]]] = []  # (operand, atom, digits it covers)
    for pos in range(n):
        found = _position(site, pos, n, state)
        digits += found[0]
        covers += found[1]
    # Outer factors first: the order a correct merge lays the heads out in.
    heads = sorted((d for d in digits if d.head), key=lambda d: (d.pos, -d.lo))
    if not heads:
        return 1
    for d in heads:
        d.sigma = _reuse(d, covers, state)
        if d.sigma is None:
            d.sigma = derangement(d.size, generator)
    q_positions = [d for d in heads if any(i == 0 and d in ds for i, _, ds in covers)]
    for _, atom, ds in covers:
        if atom.kind != "head":
            continue
        sigma = _compose(atom, ds)
        _note(state, atom.atom, sigma)
    _merge(site, state, q_positions, covers, out_axes)
    count = 1
    for d in q_positions:
        count *= d.size
    return count


def _position(site: Site, pos: int, n: int, state: _State):
    """The digits of one aligned leading axis, and which atom of each operand covers them."""
    size = 1
    for o in site.operands:
        k = pos - (n - len(o.lead))
        if k >= 0:
            size = max(size, o.sizes[k])
    if size == 1:
        return [], []
    per_operand: list[list[_Atom]] = []
    for o in site.operands:
        k = pos - (n - len(o.lead))
        if k < 0 or o.sizes[k] == 1:
            per_operand.append([])
            continue
        atoms = _atoms(o.lead[k], site, o.role, state)
        have = o.sizes[k]
        if have != size:
            if not (site.gqa and pos == n - 1 and size % have == 0):
                raise _Refused(f"{site.where}: {o.role}'s axis of {have} meets one of {size}")
            atoms = [_Atom(a.atom, a.lo * (size // have), a.kind) for a in atoms]
            atoms.append(_Atom((None, 1, size // have), 1, "free"))  # SDPA repeats kv heads
        per_operand.append(atoms)
    bounds = {1, size}
    for atoms in per_operand:
        for a in atoms:
            bounds |= {a.lo, a.lo * a.atom[2]}
    cuts = sorted(bounds)
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        if hi % lo:
            raise _Refused(
                f"{site.where}: its operands' head axes are cut in ways that do not nest"
            )
    digits = [_Digit(pos, lo, hi // lo, False) for lo, hi in zip(cuts, cuts[1:], strict=False)]
    covers = []
    for i, atoms in enumerate(per_operand):
        for a in atoms:
            covered = [d for d in digits if a.lo <= d.lo < a.lo * a.atom[2]]
            covers.append((i, a, covered))
    for d in digits:
        kinds = {a.kind for _, a, ds in covers if d in ds}
        if "unknown" in kinds:
            raise _Refused(
                f"{site.where}: the trace cannot follow {_role(site, covers, d)}'s heads back "
                "to the projection that made them"
            )
        if "fixed" in kinds and "head" in kinds:
            raise _Refused(f"{site.where}: a heads factor lines up with a batch or token one")
        d.head = kinds == {"head"} or kinds == {"head", "free"}
    return digits, covers


def _role(site: Site, covers, digit) -> str:
    for i, a, ds in covers:
        if digit in ds and a.kind == "unknown":
            return site.operands[i].role
    return "an operand"


def _atoms(axis, site: Site, role: str, state: _State) -> list[_Atom]:
    """An axis's atoms from the inside out, each with its stride within the axis."""
    found = []
    lo = 1
    for atom in reversed(axis):
        kind = _kind(atom, state.roots)
        if kind == "unknown":
            atom, kind = _entangled(atom, site, role, state)
        found.append(_Atom(atom, lo, kind))
        lo *= atom[2]
    return found


def _entangled(atom, site: Site, role: str, state: _State):
    """A heads axis a view made by cutting a projection's output across its factors
    (`W_q(x).view(b, heads, s, d_k)`, which carves heads out of the tokens): the trace
    has already reported it, and the probe shows what it does, reading the rows as a
    correct split lays them out ([heads, d_k], heads outside)."""
    found = state.entangled.get(id(atom[0].find()))
    if found is None or not D.is_whole(atom):
        return atom, "unknown"
    (source, where), n = found, atom[2]
    size = source[0].find().size
    if size % n or not _traced(source, state.roots):
        return atom, "unknown"
    note = (
        f"{role}'s heads are cut across the tokens by {where}: its rows permuted as a correct "
        "split lays them out ([heads, d_k])"
    )
    if note not in state.assumed:
        state.assumed.append(note)
    return (source[0], size // n, n), "head"


def _kind(atom, roots: set[int]) -> str:
    root = atom[0].find()
    if root.kind == D.COPY:
        return "free"
    if root.kind in (D.BATCH, D.TOKEN):
        return "fixed"
    return "head" if _traced(atom, roots) else "unknown"


def _traced(atom, roots: set[int], depth: int = 0) -> bool:
    """True when the atom reads back to a parameter's axis: it is a factor of a
    projection's output, or of a slice, split or index of one, or a dim lined up with one."""
    root = atom[0].find()
    if depth > 8:
        return False
    if root.cut is not None:
        return _traced(root.cut[0], roots, depth + 1)
    if root.alias is not None and D.is_whole(atom) and id(root) not in roots:
        return _traced(root.alias, roots, depth + 1)
    return id(root) in roots


def _reuse(digit: _Digit, covers, state: _State) -> torch.Tensor | None:
    """The permutation of a digit another site already chose, through an atom both share."""
    for _, atom, ds in covers:
        if atom.kind != "head" or digit not in ds:
            continue
        sigma = state.sigma.get(_key(atom.atom))
        canon = _canon(atom.atom) if sigma is None else None
        if canon is not None:
            sigma = state.canon.get(canon)
        if sigma is None:
            continue
        inner = digit.lo // atom.lo
        values = torch.arange(digit.size) * inner
        got = (sigma[values] // inner) % digit.size
        return got
    return None


def _compose(atom: _Atom, digits: list[_Digit]) -> torch.Tensor:
    """The atom's permutation of its values, from the permutations of the digits it covers."""
    n = atom.atom[2]
    values = torch.arange(n)
    out = torch.zeros(n, dtype=torch.long)
    for d in digits:
        inner = d.lo // atom.lo
        digit = (values // inner) % d.size
        sigma = d.sigma if d.head and d.sigma is not None else torch.arange(d.size)
        out += sigma[digit] * inner
    return out


def _key(atom) -> Key:
    return (id(atom[0].find()), atom[1], atom[2])


def _canon(atom) -> tuple | None:
    """A factor by the rows of the dim it was cut from that it covers, and its digit in
    each: the same for the factors two calls of one layer cut from its projection."""
    root = atom[0].find()
    if root.cut is None:
        return None
    top = _top(root)
    coords = _coords(root, top) if top is not None else None
    if coords is None:
        return None
    stride, size = atom[1], atom[2]
    digits = torch.where(coords >= 0, (coords.clamp(min=0) // stride) % size, -1)
    return (id(top), stride, size, digits.numpy().tobytes())


def _note(state: _State, atom, sigma: torch.Tensor) -> None:
    """Give a factor its permutation (and the factor a whole dim lines up with, its own)."""
    root = atom[0].find()
    key = _key(atom)
    seen = state.sigma.get(key)
    if seen is not None and not torch.equal(seen, sigma):
        raise _Refused(
            f"{root.origin or 'a heads axis'} feeds two attention ops in different head orders"
        )
    state.sigma[key] = sigma
    canon = _canon(atom)
    if canon is not None:
        state.canon.setdefault(canon, sigma)
    state.atoms[key] = (root, atom[1], atom[2])
    state.dims[id(root)] = root
    if root.alias is not None and D.is_whole(atom) and root.cut is None:
        _note(state, root.alias, sigma)


# -- the merge ------------------------------------------------------------------------------
def _merge(site: Site, state: _State, q_digits: list[_Digit], covers, out_axes) -> None:
    """Permute what reads the context (an output projection's columns), or the expected
    output where the context is the output."""
    positions = _positions(q_digits)
    if not site.reads and not site.reaches_output:
        raise _Refused(f"{site.where}: its heads are not merged by an output projection")
    for read in site.reads:
        index = _axis_index(read.axis, state, positions, site.d_v)
        if index is None:
            raise _Refused(
                f"{site.where}: the projection that reads its context contracts an axis "
                "whose heads the trace cannot read"
            )
        note = (
            f"the heads are lost between {site.where} and the projection that reads its "
            "context: its columns permuted as a correct merge lays them out ([heads, d_v])"
        )
        if index[1] and note not in state.assumed:
            state.assumed.append(note)
        key = id(read.weight_axis.find())
        state.columns[key] = _columns(state.columns.get(key), index[0], site)
    if site.reaches_output and out_axes is not None:
        found = False
        for axis, ax in enumerate(out_axes):
            index = _axis_index(ax, state, positions, site.d_v, fallback=axis == len(out_axes) - 1)
            if index is not None and not torch.equal(index[0], torch.arange(len(index[0]))):
                state.output.append((axis, index[0]))
                found = True
                note = (
                    f"the heads are lost between {site.where} and the output: it is permuted "
                    "as a correct merge lays them out ([heads, d_v])"
                )
                if index[1] and note not in state.assumed:
                    state.assumed.append(note)
        if not found and not site.reads:
            raise _Refused(f"{site.where}: the output keeps its heads in an axis the trace lost")


def _positions(q_digits: list[_Digit]) -> torch.Tensor:
    """The query heads' permutation over their positions (outer digits first)."""
    total = 1
    for d in q_digits:
        total *= d.size
    index = torch.zeros(total, dtype=torch.long)
    values = torch.arange(total)
    inner = total
    for d in q_digits:
        inner //= d.size
        digit = (values // inner) % d.size
        if d.sigma is None:
            raise ValueError("a query digit without its permutation (drawn before positions)")
        index += d.sigma[digit] * inner
    return index


def _axis_index(axis, state: _State, positions, d_v: int, *, fallback: bool = True):
    """(index, assumed): the permutation of an axis made of permuted factors and others;
    where none of its factors is permuted and it is as long as heads * d_v, the layout a
    correct merge makes ([heads, d_v]), assumed. None when neither fits."""
    size = D.size_of(axis)
    values = torch.arange(size)
    out = torch.zeros(size, dtype=torch.long)
    inner = size
    hit = False
    for atom in axis:
        n = atom[2]
        inner //= n
        digit = (values // inner) % n
        sigma = state.sigma.get(_key(atom))
        if sigma is None and atom[0].find().alias is not None and D.is_whole(atom):
            sigma = state.sigma.get(_key(atom[0].find().alias))
        hit = hit or sigma is not None
        out += (sigma[digit] if sigma is not None else digit) * inner
    if hit:
        return out, False
    heads = len(positions)
    if not fallback or heads < 2 or not d_v or size != heads * d_v:
        return None
    h, d = values // d_v, values % d_v
    return positions[h] * d_v + d, True


def _columns(before, index: torch.Tensor, site: Site) -> torch.Tensor:
    """The columns' permutation once a site's `index` joins what other sites chose: the
    same one again (a layer shared across depth, called twice), or one over other columns
    (contexts concatenated before one projection) composed with it."""
    if before is None:
        return index
    identity = torch.arange(len(index))
    both = (before != identity) & (index != identity)
    if not torch.equal(before[both], index[both]):
        raise _Refused(
            f"{site.where}: the projection that reads its context reads another attention "
            "op's heads in the same columns, in a different order"
        )
    return _union(before, index)


# -- index maps of dims -----------------------------------------------------------------------
def _maps(state: _State) -> dict[int, torch.Tensor]:
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
            maps[id(dim)] = m if before is None else _union(before, m)
            if dim.cut is None:
                break
            m, dim = _lift(dim, m)
    for key, (root, stride, size) in state.atoms.items():
        _check(root, stride, size, state.sigma[key], maps, dims)
    return maps


def _union(before: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
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


def _coords(dim: D.Dim, target: D.Dim) -> torch.Tensor | None:
    """For each index of `target` (an ancestor of `dim` through cuts), its index along
    `dim` (-1 where `dim` does not reach)."""
    if dim is target:
        return torch.arange(dim.size)
    if dim.cut is None:
        return None
    (parent, stride, size), kept = dim.cut
    above = _coords(parent.find(), target)
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
        c = _coords(root, dim)
        if m is not None and c is not None:
            moved = c[m]
            inside = c >= 0
            d, d2 = (c // stride) % size, (moved // stride) % size
            ok = bool((moved[~inside] < 0).all()) and bool((moved[inside] >= 0).all())
            ok = ok and bool((d2[inside] == sigma[d[inside]]).all())
            if not ok:
                raise _Refused(
                    f"{root.origin or 'a heads axis'}: its heads cannot be permuted "
                    "consistently with the others of the same projection"
                )
        if dim.cut is None:
            break
        dim = dim.cut[0][0].find()


def _clash(state: _State, maps, watch, skipped: list[Site]) -> None:
    """A permuted projection output must not also be what a projection contracts (the
    model's features), nor feed an attention op left as it was."""
    permuted = {k for k in maps if k in state.roots}
    if permuted & set(state.columns):
        raise _Refused("a projection's output rows are also the columns it reads as heads")
    for dim in watch.contracted:
        if id(dim.find()) in permuted:
            raise _Refused(
                f"{dim.find().origin}: the heads' rows are also features another projection "
                "reads, so permuting them would change more than the heads"
            )
    for site in skipped:
        for o in site.operands:
            for axis in o.lead:
                for atom in axis:
                    top = _top(atom[0].find())
                    if top is not None and id(top) in permuted:
                        raise _Refused(
                            f"{site.where}: its heads come from a projection another attention "
                            "op permutes, but the trace cannot read its own"
                        )


def _unreached(state: _State, maps, joins) -> None:
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
                raise _Refused(
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


def _moved(atom, state: _State, maps) -> bool:
    """Whether the plan permutes this atom: it is a heads factor the plan chose an order
    for, and the projection rows it came from are the ones permuted (a factor only
    lined up with those heads, from another projection, is not)."""
    if _key(atom) not in state.sigma:
        return False
    source = _source(atom)
    return id(source) in maps or id(source.find()) in maps


def _per_head(atom) -> bool:
    """An atom that differs from head to head (not a broadcast copy, batch or tokens)."""
    root = atom[0].find()
    return root.kind not in (D.COPY, D.BATCH, D.TOKEN)


def _top(dim: D.Dim, depth: int = 0):
    if depth > 8:
        return None
    if dim.cut is not None:
        return _top(dim.cut[0][0].find(), depth + 1)
    return dim


def _index_of(axis, state: _State, maps) -> torch.Tensor | None:
    """The permutation of one parameter axis (a whole dim), if it is a permuted one."""
    if len(axis) != 1 or not D.is_whole(axis[0]):
        return None
    root = axis[0][0].find()
    index = maps.get(id(root))
    if index is None:
        index = state.columns.get(id(root))
    if index is None and root.alias is not None:
        sigma = state.sigma.get(_key(root.alias))
        if sigma is not None and len(sigma) == root.size:
            index = sigma
    if index is None or torch.equal(index, torch.arange(len(index))):
        return None
    return index
