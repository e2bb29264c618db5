"""The merge after attention, for `head_layout`: the context followed to the
projections that read it, whose columns are permuted by the same digits (read from
the provenance of that axis, or, where the merge lost it, as a correct merge lays
them out: [heads, d_v])."""

import torch

from .._names import dims as D
from .head_maps import union_map
from .head_plan import Digit, PlanState, Refused, key_of
from .head_sites import Site


def follow_merge(site: Site, state: PlanState, q_digits: list[Digit], covers, out_axes) -> None:
    """Permute what reads the context (an output projection's columns), or the expected
    output where the context is the output."""
    positions = _positions(q_digits)
    if not site.reads and not site.reaches_output:
        raise Refused(f"{site.where}: its heads are not merged by an output projection")
    for read in site.reads:
        index = _axis_index(read.axis, state, positions, site.d_v)
        if index is None:
            raise Refused(
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
            raise Refused(f"{site.where}: the output keeps its heads in an axis the trace lost")


def _positions(q_digits: list[Digit]) -> torch.Tensor:
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


def _axis_index(axis, state: PlanState, positions, d_v: int, *, fallback: bool = True):
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
        sigma = state.sigma.get(key_of(atom))
        if sigma is None and atom[0].find().alias is not None and D.is_whole(atom):
            sigma = state.sigma.get(key_of(atom[0].find().alias))
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
        raise Refused(
            f"{site.where}: the projection that reads its context reads another attention "
            "op's heads in the same columns, in a different order"
        )
    return union_map(before, index)
