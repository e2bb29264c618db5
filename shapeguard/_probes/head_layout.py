"""Which rows of which parameters make each head: read from the trace's axis provenance.

At every attention op (`head_sites.Site`) the axes in front of Q's, K's and V's [seq,
features] are lined up position by position: their atoms that are factors of a
projection's output (directly, through the slices, splits and indices that cut it, or
through a dim lined up with one) are the heads; batch and token atoms stay where they
are; broadcast copies (kv heads repeated for their queries) follow whatever the query
heads do. One permutation of the head positions is drawn per site (a derangement of
each factor, so every head moves and each kv group keeps its queries), and each atom
gets the permutation of its own digit. That permutation is carried back to the rows
of the projection the atom came from (`head_maps`: through each cut, to the dim the
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

import torch

from .._names import dims as D
from .edits import derangement
from .head_maps import clash, coords_in, dim_maps, index_of, top_dim, unreached
from .head_merge import follow_merge
from .head_plan import Digit, HeadAtom, Plan, PlanState, Refused, copy_state, key_of
from .head_sites import Site


def plan_heads(watch, generator: torch.Generator) -> Plan | tuple[str, bool]:
    """The head permutation of every site the trace can read back to its projections,
    or (why there is none, whether the probe applies at all)."""
    roots = {id(atom[0].find()) for axes in watch.params.values() for a in axes for atom in a}
    state = PlanState(roots, watch.entangled)
    plan = Plan()
    why = ""
    done: list[Site] = []
    skipped: list[Site] = []
    for site in watch.sites:
        trial = copy_state(state)
        try:
            heads = _site(site, trial, generator, watch.out_axes)
        except Refused as error:
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
        maps = dim_maps(state)
        clash(state, maps, watch, skipped)
        unreached(state, maps, watch.joins)
    except Refused as error:
        return str(error), True
    for name, axes in watch.params.items():
        for axis, ax in enumerate(axes):
            index = index_of(ax, state, maps)
            if index is not None:
                plan.params.setdefault(name, []).append((axis, index))
    for name, dim in watch.paired.items():
        index = maps.get(id(dim.find()))
        if index is not None and name not in plan.params and len(index) > 1:
            plan.params[name] = [(0, index)]
    plan.outputs = state.output
    plan.assumed = state.assumed
    return plan


# -- one site -------------------------------------------------------------------------------
def _site(site: Site, state: PlanState, generator, out_axes) -> int:
    """Choose the site's head permutation and note it in `state`; the number of heads."""
    if len(site.operands) < 3:
        raise Refused(f"{site.where}: the trace saw no product of its attention with V")
    if site.mixed:
        raise Refused(
            f"{site.where}: its context meets another tensor at {site.mixed} before any "
            "projection reads it, so its columns are not the heads' alone"
        )
    n = max(len(o.lead) for o in site.operands)
    digits: list[Digit] = []
    covers: list[tuple[int, HeadAtom, list[Digit]]] = []  # (operand, atom, digits it covers)
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
    follow_merge(site, state, q_positions, covers, out_axes)
    count = 1
    for d in q_positions:
        count *= d.size
    return count


def _position(site: Site, pos: int, n: int, state: PlanState):
    """The digits of one aligned leading axis, and which atom of each operand covers them."""
    size = 1
    for o in site.operands:
        k = pos - (n - len(o.lead))
        if k >= 0:
            size = max(size, o.sizes[k])
    if size == 1:
        return [], []
    per_operand: list[list[HeadAtom]] = []
    for o in site.operands:
        k = pos - (n - len(o.lead))
        if k < 0 or o.sizes[k] == 1:
            per_operand.append([])
            continue
        atoms = _atoms(o.lead[k], site, o.role, state)
        have = o.sizes[k]
        if have != size:
            if not (site.gqa and pos == n - 1 and size % have == 0):
                raise Refused(f"{site.where}: {o.role}'s axis of {have} meets one of {size}")
            atoms = [HeadAtom(a.atom, a.lo * (size // have), a.kind) for a in atoms]
            atoms.append(HeadAtom((None, 1, size // have), 1, "free"))  # SDPA repeats kv heads
        per_operand.append(atoms)
    bounds = {1, size}
    for atoms in per_operand:
        for a in atoms:
            bounds |= {a.lo, a.lo * a.atom[2]}
    cuts = sorted(bounds)
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        if hi % lo:
            raise Refused(f"{site.where}: its operands' head axes are cut in ways that do not nest")
    digits = [Digit(pos, lo, hi // lo, False) for lo, hi in zip(cuts, cuts[1:], strict=False)]
    covers = []
    for i, atoms in enumerate(per_operand):
        for a in atoms:
            covered = [d for d in digits if a.lo <= d.lo < a.lo * a.atom[2]]
            covers.append((i, a, covered))
    for d in digits:
        kinds = {a.kind for _, a, ds in covers if d in ds}
        if "unknown" in kinds:
            raise Refused(
                f"{site.where}: the trace cannot follow {_role(site, covers, d)}'s heads back "
                "to the projection that made them"
            )
        if "fixed" in kinds and "head" in kinds:
            raise Refused(f"{site.where}: a heads factor lines up with a batch or token one")
        d.head = kinds == {"head"} or kinds == {"head", "free"}
    return digits, covers


def _role(site: Site, covers, digit) -> str:
    for i, a, ds in covers:
        if digit in ds and a.kind == "unknown":
            return site.operands[i].role
    return "an operand"


def _atoms(axis, site: Site, role: str, state: PlanState) -> list[HeadAtom]:
    """An axis's atoms from the inside out, each with its stride within the axis."""
    found = []
    lo = 1
    for atom in reversed(axis):
        kind = _kind(atom, state.roots)
        if kind == "unknown":
            atom, kind = _entangled(atom, site, role, state)
        found.append(HeadAtom(atom, lo, kind))
        lo *= atom[2]
    return found


def _entangled(atom, site: Site, role: str, state: PlanState):
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


def _reuse(digit: Digit, covers, state: PlanState) -> torch.Tensor | None:
    """The permutation of a digit another site already chose, through an atom both share."""
    for _, atom, ds in covers:
        if atom.kind != "head" or digit not in ds:
            continue
        sigma = state.sigma.get(key_of(atom.atom))
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


def _compose(atom: HeadAtom, digits: list[Digit]) -> torch.Tensor:
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


def _canon(atom) -> tuple | None:
    """A factor by the rows of the dim it was cut from that it covers, and its digit in
    each: the same for the factors two calls of one layer cut from its projection."""
    root = atom[0].find()
    if root.cut is None:
        return None
    top = top_dim(root)
    coords = coords_in(root, top) if top is not None else None
    if coords is None:
        return None
    stride, size = atom[1], atom[2]
    digits = torch.where(coords >= 0, (coords.clamp(min=0) // stride) % size, -1)
    return (id(top), stride, size, digits.numpy().tobytes())


def _note(state: PlanState, atom, sigma: torch.Tensor) -> None:
    """Give a factor its permutation (and the factor a whole dim lines up with, its own)."""
    root = atom[0].find()
    key = key_of(atom)
    seen = state.sigma.get(key)
    if seen is not None and not torch.equal(seen, sigma):
        raise Refused(
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
