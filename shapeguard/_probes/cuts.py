"""Where the positions of a token axis went when no output keeps them: the op that cut,
pooled or convolved them (`Watch` notes it while the forward is traced), or the output
axis they were merged into. `layout.read_layout` says it as the reason the sequence
probes do not apply: what the trace saw, never a guess from sizes (issue 30: nanoGPT's
`logits[:, [-1], :]` was told "patches, strided frames")."""

from dataclasses import dataclass

from .. import _ops
from .._names import dims as D
from .layout_records import axis_kind, root_of

# The ops after which a token axis can be gone from a tensor with its positions used:
# picked (t[:, [-1]], gather), pooled (mean, amax) or made into new ones (a strided conv).
CUTTING = _ops.family_ops(_ops.INDEX, _ops.REDUCE, _ops.CONV)


@dataclass(slots=True)
class Cut:
    """One op that took a token axis's dim out of its output."""

    dim: D.Dim  # the token axis's dim (its root when noted)
    family: str  # the op's family: INDEX, REDUCE or CONV
    where: str  # the op, its line and module (`watch.describe_event`)
    before: tuple[int, ...]  # the shape that had the axis
    after: tuple[int, ...]  # the output's shape
    axis: int  # the axis in `before`


def note_cuts(cuts: dict, session, op: str, args, out, where) -> None:
    """Note in `cuts` ({id of a dim: Cut}, the last op for each) each token axis of the
    op's first tensor argument whose dim its output does not hold. `where()` names the op."""
    import torch

    from .tree import first_output

    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    out = first_output(out)
    if x is None or out is None:
        return
    x_meta, out_meta = session.metas.get(x), session.metas.get(out)
    if x_meta is None or out_meta is None or len(x_meta.dims) != x.dim():
        return
    kept = {id(atom[0].find()) for axis in out_meta.dims for atom in axis}
    declared = _ops.declared(op)
    family = declared.family if declared is not None else ""
    for d, axis in enumerate(x_meta.dims):
        root = root_of(axis)
        if root is None or axis_kind(axis) != D.TOKEN or id(root) in kept:
            continue
        cuts[id(root)] = Cut(root, family, where(), tuple(x.shape), tuple(out.shape), d)


def cut_of(cuts: dict, root) -> Cut | None:
    """The last op noted for this dim (compared by identity after the forward's merges)."""
    found = [cut for cut in cuts.values() if cut.dim.find() is root.find()]
    return found[-1] if found else None


def said(cut: Cut) -> str:
    """What the op did to the positions, in its shapes: `x[:, [-1], :]`'s
    "__getitem__ at model.py:20 (GPT) takes [3, 7, 32] to [3, 1, 32]: it keeps 1 of the 7
    positions"."""
    n = cut.before[cut.axis]
    moved = f"{cut.where} takes {list(cut.before)} to {list(cut.after)}"
    if cut.family == _ops.INDEX and len(cut.after) == len(cut.before):
        kept = cut.after[cut.axis]
        return f"{moved}: it keeps {kept} of the {n} positions"
    if cut.family == _ops.INDEX:
        return f"{moved}: it picks positions out of the {n}, with no axis for them"
    if cut.family == _ops.REDUCE:
        return f"{moved}: it reduces the {n} positions to one"
    return f"{moved}: it makes new positions from the {n} (patches, strided frames)"


def merged(outputs, root) -> str:
    """How an output holds the dim only merged with others (logits flattened to
    [batch*seq, vocab]: "the output [21, 50] holds its 7 positions only merged into axis 0,
    21 = batch 3 x seq 7"), or ""."""
    for _, t, meta in outputs:
        axes = getattr(meta, "dims", None) or ()
        for d, axis in enumerate(axes):
            if len(axis) > 1 and any(atom[0].find() is root.find() for atom in axis):
                parts = " x ".join(
                    f"{D.known_name((atom,)) or 'axis'} {int(atom[2])}" for atom in axis
                )
                return (
                    f"the output {list(t.shape)} holds its {int(root.size)} positions only "
                    f"merged into axis {d}, {int(t.shape[d])} = {parts}"
                )
    return ""
