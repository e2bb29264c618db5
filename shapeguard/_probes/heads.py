"""The head-permutation probe: permuting heads in the projections leaves the output alone."""

import torch

from .. import _ops
from .compare import deviation, scale_of
from .edits import derangement, take
from .head_bias import per_head_bias
from .head_groups import HeadGroup, mha_groups
from .head_layout import Plan, plan_heads
from .result import ProbeResult, inconclusive, not_applicable
from .runs import call
from .subject import Subject
from .tree import first_output
from .watch import describe_event


def head_orders(heads: int, kv: int, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(query-head order, kv-head order): kv heads deranged, and the query heads of each
    kv group moved with their group and rotated within it, so grouped-query attention
    keeps every query head with its own kv head."""
    group = heads // kv
    kv_order = derangement(kv, generator) if kv > 1 else torch.zeros(1, dtype=torch.long)
    within = torch.roll(torch.arange(group), 1)
    q_order = torch.tensor(
        [int(kv_order[h // group]) * group + int(within[h % group]) for h in range(heads)]
    )
    return q_order, kv_order


def block_index(size: int, offset: int, order: torch.Tensor, d_k: int) -> torch.Tensor:
    """An index over `size` positions that reorders the head blocks at `offset`."""
    index = torch.arange(size)
    blocks = (order[:, None] * d_k + torch.arange(d_k)[None, :]).flatten() + offset
    index[offset : offset + blocks.numel()] = blocks
    return index


def permute_heads(model, group: HeadGroup, q_order, kv_order) -> None:
    """Reorder the head blocks of `group`'s parameters in place."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for rows in group.rows:
            param = params[rows.param]
            order = kv_order if rows.kv else q_order
            index = block_index(param.shape[rows.axis], rows.offset, order, rows.d_k)
            param.copy_(param.index_select(rows.axis, index.to(param.device)))


def head_permutation(s: Subject) -> ProbeResult:
    """Permuting the heads in the Q/K/V rows and the output columns leaves the output unchanged."""
    import copy

    name = "head-permutation invariance"
    if s.distributed:
        return inconclusive(
            name, f"{s.distributed}: permuting its rows would move heads across shards"
        )
    bias = per_head_bias(s.events)
    if bias:
        return not_applicable(
            name, f"the scores get a bias per head ({bias}): permuting heads is no symmetry"
        )
    groups = mha_groups(s.model)
    plan = plan_heads(s.watch.heads, s.generator)
    if isinstance(plan, tuple) and not groups:
        why, applies = plan
        return inconclusive(name, why) if applies else not_applicable(name, why)
    try:
        model = copy.deepcopy(s.model)
    except Exception as error:
        return inconclusive(name, f"the module cannot be copied to permute its heads ({error})")
    expected = s.reference
    described = []
    for group in groups:
        q_order, kv_order = head_orders(group.heads, group.kv_heads, s.generator)
        permute_heads(model, group, q_order, kv_order)
        described.append(f"{group.heads} heads of {group.name or type(model).__name__}")
    assumed: list[str] = []
    if isinstance(plan, Plan):
        misfit = _misfit(model, plan.params)
        if misfit:
            return inconclusive(name, misfit)
        permute_params(model, plan.params)
        for axis, index in plan.outputs:
            expected = take(expected, axis, index)
        described += plan.described
        assumed = plan.assumed
    out = first_output(call(model, s.inputs, "the heads permuted"))
    if out is None or out.shape != expected.shape:
        return inconclusive(name, "the module with its heads permuted returns another output")
    dev = deviation(out, expected, scale_of(s.reference))
    return s.result(
        name,
        dev,
        f"permuting the {', '.join(described)} (Q/K/V projection rows, output projection columns)",
        "the output",
        "heads are not kept apart between the split and the merge: split d_model into "
        "[heads, d_k] and move heads next to batch (view then transpose), and transpose back "
        "before merging",
        lambda: _head_ops(s.events, assumed),
        lead="",
    )


def _misfit(model, params: dict) -> str:
    """Why the permutation read for some parameter does not fit its shape ("" when all
    fit): the head layout the trace read is not that parameter's."""
    found = dict(model.named_parameters())
    for name, moves in params.items():
        param = found.get(name)
        if param is None:
            continue
        for axis, index in moves:
            if axis >= param.dim() or len(index) != param.shape[axis]:
                return (
                    f"the heads read for {name} {list(param.shape)} do not fit its axis "
                    f"{axis}: the trace's head layout is not that parameter's"
                )
    return ""


def permute_params(model, params: dict) -> None:
    """Reorder parameter axes in place: `params` maps a name to (axis, index) pairs."""
    found = dict(model.named_parameters())
    with torch.no_grad():
        for name, moves in params.items():
            param = found.get(name)
            if param is None:
                continue
            value = param.detach()
            for axis, index in moves:
                value = value.index_select(axis, index.to(param.device))
            param.copy_(value)


def _head_ops(events, assumed=()) -> str:
    """Where heads are split off the features and merged back (and where the trace lost
    the heads at the merge, so the columns were permuted as a correct merge lays them out)."""
    split = merge = None
    for event in events:
        has_in = any("heads" in (r.axes or ()) for r in event.inputs)
        has_out = any("heads" in (r.axes or ()) for r in event.outputs)
        if split is None and has_out and not has_in:
            split = event
        elif split is not None and has_in and not has_out and event.op in _MERGES:
            merge = event
            break
    parts = []
    if split is not None:
        parts.append(f"heads split by {describe_event(split)}")
    if merge is not None:
        parts.append(f"merged by {describe_event(merge)}")
    text = " and ".join(parts)
    return "; ".join([text, *assumed] if text else assumed)


# Heads are merged back by an op that regroups or reorders axes (view, reshape, flatten,
# transpose, permute): a reduction or a product that drops them is not a merge.
_MERGES = _ops.family_ops(_ops.VIEW, _ops.LAYOUT)
