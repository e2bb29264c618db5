"""Tensor parallelism: head counts against the tp degree, global counts on local shards
and local counts on DTensors, DTensors mixed with plain tensors.

The sharding is read from the DTensor weights of a module's projections (`_tp`), never
by a collective, so the same checks run on real ranks, on torch's fake process group and
on the meta device:

- `tp_head_divisibility`: a column-parallel q/k/v projection whose head count the tp
  degree does not divide, so a rank would hold part of a head (Llama-3-8B's 8 kv heads
  at tp=16, torchtitan#932), with the degrees that work and, past the kv head count,
  kv replication;
- `tp_global_heads`: a view of this rank's local shard into the module's global head
  count (the attribute the TP tutorial says to divide by tp);
- `tp_local_heads`: the mirror, a view of a DTensor (global sizes) into the local count;
- `dtensor_mixed`: an op given a DTensor and a plain tensor, which DTensor refuses;
- `tp_shard_replicated` (sequence parallelism): a tensor every rank holds whole declared
  this rank's shard;
- `tp_shard_axis_mismatch` (sequence parallelism): attention given the gather of a
  reduce-scatter's piece declared a shard of another axis than the one it was split along.

The view checks are accounts the view rules (`heads_view`, `regroup`) ask for through
`_accounts`, where this module registers them: they explain a failure those rules find,
in TP terms, instead of adding a second finding for it, and those rules never import this
module. Everything of the trace these rules read of tensor parallelism is `call.tp`.
"""

from collections.abc import Iterator
from math import prod

from .. import _ops, _tp
from .._errors import Violation
from .._names import axes as _axes
from . import ERROR, WARNING, declare, is_tensor, rule
from ._accounts import accounts_for_carve, accounts_for_count
from ._view import CallView

# Raised through the view rule (heads_view), which explains its own failures in TP terms.
declare("tp", {"tp_global_heads": ERROR, "tp_local_heads": ERROR})


def _local_tp(split) -> str:
    return f"tp={split.tp}" + (f" (mesh dim '{split.mesh_dim}')" if split.mesh_dim != "tp" else "")


# -- head counts the tp degree does not divide ---------------------------------------------------
@rule(_ops.by_name("linear"), kinds={"tp_head_divisibility": ERROR})
def sharded_projection(call: CallView) -> Iterator[Violation]:
    """A column-parallel projection cuts its heads: read when it runs (FSDP2 has unsharded
    its weight by then, so only the TP sharding is left)."""
    tp = call.tp
    if tp is None:
        return
    weight = call.bound().get("weight")
    if not _tp.is_dtensor(weight):
        return
    leaf = call.module  # the projection running (an nn.Linear), inside its owner
    if leaf is None:
        return
    module, split = tp.owner()
    if module is leaf or split is None or split.head_dim is None:
        return
    projection = next(
        (p for name, p in split.projections.items() if getattr(module, name, None) is leaf),
        None,
    )
    if projection is None or projection.style != "column":
        return
    count = split.count_of(projection)
    if count is None or count.total % split.tp == 0:
        return
    yield _divisibility(split, projection, count)


def _divisibility(split, projection, count) -> Violation:
    tp, hd = split.tp, split.head_dim
    kv = count is split.kv_heads
    what = "kv" if kv else ""
    out = projection.out_features
    sizes = _tp.chunk_sizes(out, tp)
    spelled = f"{count.attr}={count.total}" if count.declared == count.total else (
        f"{projection.name}'s {count.total} {'kv ' if kv else ''}heads "
        f"({count.attr}={count.declared} in the module)"
    )  # fmt: skip
    if len(set(sizes)) == 1:
        share = (
            f"each rank would hold {_tp.heads_text(sizes[0], hd, what)} ({sizes[0]} of "
            f"{projection.name}'s {out} output features, head_dim {hd})"
        )
    else:
        shown = sorted(set(sizes), reverse=True)
        share = (
            f"the ranks would hold {_tp.join(shown)} of {projection.name}'s {out} output "
            f"features, cutting {'kv ' if kv else ''}heads of {hd} apart"
        )
    relation = f"{spelled} is not divisible by tp={tp}: {share}; {projection.where()}"
    return Violation("tp_head_divisibility", relation, (), _degrees_hint(split, count))


def _degrees_hint(split, count) -> str:
    heads, kv = split.heads, split.kv_heads
    named = ", ".join(f"{c.attr}={c.total}" for c in (heads, kv) if c is not None)
    degrees = split.degrees() or [1]
    hint = f"tp degrees that work for {named}: {', '.join(map(str, degrees))}"
    tp = split.tp
    if (
        kv is not None
        and count is kv
        and tp > kv.total
        and tp % kv.total == 0
        and (heads is None or heads.total % tp == 0)
    ):
        k = split.by_role("k")
        v = split.by_role("v")
        names = _tp.join([p.name for p in (k, v) if p is not None]) or "the k and v projections"
        hint += (
            f"; past {kv.attr}={kv.total}, each kv head has to be replicated on "
            f"tp // {kv.attr} = {tp // kv.total} ranks instead of cut (Megatron does this): "
            f"leave {names} unsharded and select the kv heads this rank's query heads use"
        )
    return hint


# -- global counts on local shards, local counts on DTensors ---------------------------------------
def _head_split(target, resolved, split, x_features: int):
    """(count, where in the target) when the view cuts x's last axis into
    [count, head_dim]; None otherwise."""
    hd = split.head_dim
    if hd is None or len(target) < 2 or target[-1] != hd or target[-2] in (-1, 1):
        return None
    return target[-2]


@accounts_for_count
def view_violation(call: CallView, x, target, expr: str, label: str) -> Violation | None:
    """A view whose element count is wrong because of tensor parallelism: the global head
    count on this rank's shard (`tp_global_heads`), or the local count on a DTensor
    (`tp_local_heads`). None when TP does not explain it."""
    tp = call.tp
    if tp is None or not is_tensor(x) or x.dim() < 1:
        return None
    module, split = tp.owner()
    if split is None or split.head_dim is None:
        return None
    features = int(x.shape[-1])
    count = _head_split(target, None, split, features)
    if count is None:
        return None
    hd = split.head_dim
    operands = (call.operand(label, x),)
    if _tp.is_dtensor(x):
        return _local_on_dtensor(call, x, split, count, features, expr, label, operands)
    projection = _projection_of(call, module, split, x, features)
    if projection is None or projection.out_features != count * hd:
        return None
    heads = split.count_of(projection)
    if heads is None or heads.total != count or heads.local is None:
        return None
    rest = prod(int(s) for s in x.shape[:-1])
    if rest * count * hd == prod(int(s) for s in x.shape):
        return None  # it fits after all
    lead = ", ".join(str(s) for s in target[:-2])
    lead = f"{lead}, " if lead else ""
    # With -1 for the heads, the leading sizes must be given: x's own (a -1 among them
    # would make two).
    fixed = target[:-2] if -1 not in target[:-2] else tuple(int(s) for s in x.shape[:-1])
    fixed = ", ".join(str(s) for s in fixed)
    fixed = f"{fixed}, " if fixed else ""
    relation = (
        f"{expr}: {heads.attr}={count} is the global head count, but {label} is this rank's "
        f"shard of {projection.name}: {features} = {projection.out_features} / tp={split.tp} "
        f"features ({projection.name} is column-parallel), {heads.local} heads of {hd}"
    )
    hint = (
        f"use the local head count, {heads.attr} // tp = {heads.local}: "
        f"{label}.view({lead}{heads.local}, {hd}); or -1 as torchtitan does "
        f"({label}.view({fixed}-1, {hd})), which works at any tp; or keep DTensor activations "
        "(ColwiseParallel(use_local_output=False)) and global sizes"
    )
    return Violation("tp_global_heads", relation, operands, hint)


def _local_on_dtensor(call: CallView, x, split, count, features, expr, label, operands):
    hd, tp = split.head_dim, split.tp
    local = _tp.local_shape(x)
    if features != count * hd * tp or local[-1] != count * hd:
        return None
    heads = next(
        (c for c in (split.heads, split.kv_heads) if c is not None and c.local == count), None
    )
    if heads is None:
        return None
    lead = ", ".join(str(s) for s in x.shape[:-1])
    relation = (
        f"{expr}: {label} is a DTensor ({_tp.sharding_text(x)}), and a view of a DTensor "
        f"takes global sizes, but "
        + (
            f"{heads.attr}={count} is the local head count ({heads.total} / tp={tp})"
            if heads.declared == count
            else f"{count} is the local head count ({heads.attr}={heads.total} / tp={tp})"
        )
    )
    attr_note = (
        f"do not divide {heads.attr} by tp while the activations stay DTensors"
        if heads.declared == count
        else f"{heads.attr}={heads.total} is already the count a DTensor view takes"
    )
    hint = (
        f"view the DTensor with global sizes, {label}.view({lead}, {heads.total}, {hd}) or "
        f"{label}.view({lead}, -1, {hd}) ({attr_note}); or ask for local shards "
        "(ColwiseParallel(use_local_output=True)) and keep the local count"
    )
    return Violation("tp_local_heads", relation, operands, hint)


@accounts_for_carve
def carve_note(call: CallView, x, label: str, count: int | None = None) -> str | None:
    """For the T5 spelling `view(bs, -1, n_heads, d)` of a local shard, which folds the
    missing tp factor into the sequence axis: what tp did, for the hint."""
    tp = call.tp
    if tp is None or _tp.is_dtensor(x) or not is_tensor(x):
        return None
    module, split = tp.owner()
    if split is None or split.head_dim is None:
        return None
    features = int(x.shape[-1])
    projection = _projection_of(call, module, split, x, features)
    if projection is None:
        return None
    heads = split.count_of(projection)
    if heads is None or heads.local is None or heads.declared != heads.total:
        return None
    if count is not None and count != heads.total:
        return None
    return (
        f"{label} is this rank's shard of {projection.name}: {features} = "
        f"{projection.out_features} / tp={split.tp} features, so the -1 absorbed tp={split.tp} "
        f"into the sequence axis; use the local head count {heads.attr} // tp = {heads.local}, "
        f"or -1 for the heads: {label}.view(batch, seq, -1, {split.head_dim})"
    )


def _projection_of(call: CallView, module, split, x, features: int):
    """The column-parallel projection `x` is this rank's output of: by provenance (its
    last axis is a factor of the projection's output features), else the only one of
    that local width, else the one its name says (xk, xv)."""
    from .._names import dims as D

    candidates = [
        p for p in split.projections.values() if p.style == "column" and p.local == features
    ]
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    meta = call.meta(x)
    if meta is not None and meta.dims:
        roots = {id(r) for r in D.roots_of(meta.dims[-1])}
        for p in candidates:
            weight = getattr(getattr(module, p.name, None), "weight", None)
            wm = call.meta(weight) if weight is not None else None
            if wm is not None and wm.dims and roots & {id(r) for r in D.roots_of(wm.dims[0])}:
                return p
    role = (call.role(x) or "").lower()
    return next((p for p in candidates if p.role == role), candidates[0])


# -- DTensors mixed with plain tensors -----------------------------------------------------------
_MIXED_OPS = tuple(
    op for op in _ops.ALL if op.family in (_ops.PRODUCT, _ops.JOIN) or op is _ops.SDPA
)
_BINARY_OPS = tuple(op for op in _ops.ALL if op.family == _ops.BINARY)


# `t * 0.5` mixes nothing: on elementwise ops the rule reads calls of two tensors only, so
# a replayed step whose number changed keeps its verdict (`Rule.operands`).
@rule(*_BINARY_OPS, kinds={"dtensor_mixed": ERROR}, operands=2)
def dtensor_mixed_elementwise(call: CallView) -> Iterator[Violation]:
    """`dtensor_mixed` for `+ - * /` and their kin."""
    return dtensor_mixed(call)


@rule(*_MIXED_OPS, kinds={"dtensor_mixed": ERROR})
def dtensor_mixed(call: CallView) -> Iterator[Violation]:
    """DTensor refuses an op that mixes it with a plain tensor of more than one element
    (unless implicit replication is on): named before torch raises, operand by operand."""
    if _tp.dtensor_class() is None:
        return
    tensors = call.tensors()
    if len(tensors) < 2:
        return
    dtensors = [t for t in tensors if _tp.is_dtensor(t)]
    if not dtensors:
        return
    plain = [t for t in tensors if not _tp.is_dtensor(t) and t.numel() != 1]
    if not plain or _implicit_replication():
        return
    labels = _labels(call)
    shown = [(labels.get(id(t), "a tensor"), t) for t in tensors]
    dt_names = _tp.join([labels.get(id(t), "a tensor") for t in dtensors])
    plain_names = _tp.join([labels.get(id(t), "a tensor") for t in plain])
    dt = dtensors[0]
    mesh = ", ".join(f"{n}={s}" for n, s in _tp.mesh_dims(dt.device_mesh))
    one = len(plain) == 1
    relation = (
        f"{call.op}: mixes DTensor and plain tensors: {dt_names} "
        f"{'is a DTensor' if len(dtensors) == 1 else 'are DTensors'} ({_tp.sharding_text(dt)}), "
        f"{plain_names} {'is a plain torch.Tensor' if one else 'are plain torch.Tensors'}"
    )
    first = plain_names.split(" and ")[0].split(", ")[0]
    hint = (
        f"make {plain_names} a DTensor on the same mesh ({mesh}), e.g. "
        f"DTensor.from_local({first}, mesh, [Replicate()]) for a value every rank holds whole; "
        "or work on local shards throughout (use_local_output=True, or .to_local())"
    )
    yield Violation(
        "dtensor_mixed", relation, tuple(call.operand(name, t) for name, t in shown), hint
    )


def _implicit_replication() -> bool:
    import torch

    getter = getattr(torch._C, "_get_dtensor_allow_implicit_replication", None)
    return bool(getter()) if getter is not None else False


def _labels(call: CallView) -> dict[int, str]:
    found: dict[int, str] = {}
    for i, arg in enumerate(call.args):
        if is_tensor(arg):
            found.setdefault(id(arg), call.label(i, f"arg{i}"))
        elif isinstance(arg, tuple | list):
            for j, t in enumerate(arg):
                if is_tensor(t):
                    found.setdefault(id(t), call.label_of(t, f"arg{i}[{j}]"))
    for name, value in call.kwargs.items():
        if is_tensor(value):
            found.setdefault(id(value), call.label_of(value, name))
    return found


# -- a replicated tensor declared this rank's shard -------------------------------------------
# What first reads a DTensor a plan declared: the norms and dropout SequenceParallel
# supports, attention's projections, any op of two tensors. Elementwise ops of a tensor
# and a number stay unread, so a replayed step whose number changed (an optimizer's
# step size) keeps its replay (`_replay_match.loose_numbers`).
_ELEMENTWISE = (_ops.SAME, _ops.BINARY, _ops.OTHER)
_SHARD_READERS = tuple(
    op for op in _ops.ALL if op.family not in _ELEMENTWISE or op.sequence_parallel
)


@rule(*_BINARY_OPS, kinds={"tp_shard_replicated": WARNING}, operands=2)
def shard_of_replicated_elementwise(call: CallView) -> Iterator[Violation]:
    """`tp_shard_replicated` for `+ - * /` of two tensors."""
    return shard_of_replicated(call)


@rule(*_SHARD_READERS, kinds={"tp_shard_replicated": WARNING})
def shard_of_replicated(call: CallView) -> Iterator[Violation]:
    """A DTensor `Shard(d)` whose local tensor every rank holds whole: a plan's
    `from_local(t, [Shard(d)])` (SequenceParallel, `PrepareModuleInput(input_layouts=
    Shard(d))`) given the replicated output of a collective (RowwiseParallel's default
    Replicate output, a gather). DTensor then takes the tp copies for tp different
    pieces: a global axis tp times too long, every rank's rows tiled (pytorch#129355).

    Read from provenance only: the local tensor is the output of an all_reduce or an
    all_gather over the very process group the placement shards along (`_trace.tp_session`
    marks them in torch.distributed's plumbing). A tensor fed to the model, whose
    placement nothing records, is never claimed replicated: SequenceParallel's own
    contract is an input already sharded by the caller."""
    tp = call.tp
    if tp is None or not tp.any_replicated():
        return  # no collective ran: nothing is replicated (one test, on every op)
    for t in call.tensors():
        dtensor = _tp.is_dtensor(t)
        gathered = tp.tiled(t._local_tensor if dtensor else t)
        if gathered is not None:
            yield _gather_of_replicated(call, t, gathered)
            return
        if not dtensor:
            continue
        for k, p in enumerate(t.placements):
            if type(p).__name__ != "Shard":
                continue
            found = tp.replicated(t._local_tensor, t.device_mesh, k)
            if found is not None:
                yield _shard_of_replicated(call, t, k, p.dim % t.dim(), found)
                return


def _shard_of_replicated(call: CallView, t, k: int, d: int, found) -> Violation:
    name, tp = _tp.mesh_dims(t.device_mesh)[k]
    local = _tp.local_shape(t)
    label = call.label_of(t, "input")
    named = _axes.axis_label(found.axes, d, len(found.axes)) if found.axes else ""
    axis = named if named and not named.startswith("dim") else f"dim {d}"
    module = call.module
    path = call.module_path(module) if module is not None else ""
    here = f"{path} ({type(module).__name__})" if path else "this module"
    made = f"{found.module}'s {found.collective}" if found.module else found.collective
    relation = (
        f"{call.op}: {label} is declared Shard({d}) on {name}={tp}, this rank's 1/{tp} of "
        f"{axis}, but its local tensor {list(local)} is replicated: every rank holds the same "
        f"{local[d]} rows, made whole by {made}; as a DTensor its {axis} is {int(t.shape[d])} "
        f"= {local[d]} x {name}={tp}, the same rows {tp} times"
    )
    hint = _upstream_hint(found, d, here)
    return Violation("tp_shard_replicated", relation, (call.operand(label, t),), hint)


def _gather_of_replicated(call: CallView, t, gathered) -> Violation:
    """The other half of the mistake: the Shard(d) declared on a replicated tensor
    redistributed to Replicate (`PrepareModuleInput(input_layouts=Shard(1),
    desired_input_layouts=Replicate())`), whose all_gather stacks the tp copies."""
    source = gathered.tiled
    label = call.label_of(t, "input")
    shape = [int(s) for s in t.shape]
    grown = [
        d for d, (n, m) in enumerate(zip(shape, source.shape, strict=False))
        if n != m and m and n % m == 0
    ]  # fmt: skip
    if len(grown) == 1 and len(shape) == len(source.shape):
        d = grown[0]
        tp = shape[d] // source.shape[d]
        named = _axes.axis_label(source.axes, d, len(source.axes)) if source.axes else ""
        axis = named if named and not named.startswith("dim") else f"dim {d}"
        size = f"its {axis} is {shape[d]} = {source.shape[d]} x {tp} ranks, "
    else:
        size = ""
    made = f"{source.module}'s {source.collective}" if source.module else source.collective
    by = f"{gathered.module}'s {gathered.collective}" if gathered.module else gathered.collective
    relation = (
        f"{call.op}: {label} {list(shape)} is {by} of a tensor every rank already held "
        f"whole ({list(source.shape)}, made whole by {made}), declared this rank's shard on "
        f"the way: {size}the same rows stacked once per rank"
    )
    module = gathered.module or "the module"
    hint = (
        f"declare what {module} is given: PrepareModuleInput(input_layouts=Replicate(), "
        "desired_input_layouts=Replicate()) (nothing to gather); "
        + _upstream_hint(source, grown[0] if len(grown) == 1 else 1, None)
    )
    return Violation("tp_shard_replicated", relation, (call.operand(label, t),), hint)


def _upstream_hint(found, d: int, here: str | None) -> str:
    """How to hand a sequence-parallel module what it declares: keep the sequence sharded
    where the replicated tensor was made (a row-parallel output's all_reduce), or give it
    a DTensor, which SequenceParallel redistributes itself."""
    if found.collective != "all_reduce" or not found.module:
        return (
            f"{found.module or 'its producer'} gathers it whole with {found.collective}: "
            f"declare it Replicate there (input_layouts=Replicate()), or leave it sharded"
        )
    hint = (
        f"keep the sequence sharded upstream: RowwiseParallel(output_layouts=Shard({d})) on "
        f"{found.module}, as torchtitan's sequence-parallel plan does"
    )
    if here is not None:
        hint += (
            f"; or hand {here} a DTensor, RowwiseParallel(use_local_output=False) on "
            f"{found.module}, which SequenceParallel cuts to Shard({d}) with no communication"
        )
    return hint


# -- attention given a shard gathered along another axis than it was split along ---------------
@rule(_ops.by_name("linear"), kinds={"tp_shard_axis_mismatch": WARNING})
def shard_axis_mismatch(call: CallView) -> Iterator[Violation]:
    """Attention's input gathered along another axis than the one a reduce-scatter split:
    `RowwiseParallel(output_layouts=Shard(1))` scatters seq, the next sublayer's plan
    (`SequenceParallel(sequence_dim=0)`, `PrepareModuleInput(input_layouts=Shard(0))`)
    takes the piece for a slice of batch, and the gather to Replicate stacks the ranks'
    slices of seq as batch items. Attention then mixes tokens within sequences that are
    not the model's: wrong values, no error.

    Read from provenance only: the axis the scatter split (in the user's layout), followed
    through DTensor's chunk-and-cat plumbing by argument and through the user's
    elementwise ops and transposes (`_trace.tp_session`), against the axis the gather stacked
    along (both in the gather's layout, so a transpose after it changes nothing). Reported
    where the gathered tensor reaches a column-parallel q (or fused qkv) projection: a
    position-wise sublayer (norm, MLP) given the same mismatch scatters each token back
    where it was, computing the right values, and sharding one axis throughout (batch
    instead of seq) is consistent; neither is a finding."""
    tp = call.tp
    if tp is None or not tp.any_gathered():
        return  # no gather of a scattered piece in this trace (one test, on every linear)
    leaf = call.module
    module, split = tp.owner()
    if leaf is None or split is None or module is leaf:
        return
    projection = next(
        (p for name, p in split.projections.items() if getattr(module, name, None) is leaf),
        None,
    )
    if projection is None or projection.style != "column" or not _first_reader(split, projection):
        return
    x = call.bound().get("input")
    if x is None or not is_tensor(x):
        return
    gathered = tp.gathered(x._local_tensor if _tp.is_dtensor(x) else x)  # type: ignore[attr-defined]
    if gathered is None or gathered.dim == gathered.split.dim:
        return
    yield _gathered_across(call, x, gathered, call.module_path(module), projection.name)


def _first_reader(split, projection) -> bool:
    """The projection that reports for its attention: q, a fused one, else k, else v."""
    roles = {p.role for p in split.projections.values() if p.style == "column"}
    first = next((r for r in ("q", "", "k", "v") if r in roles), None)
    return projection.role == first


def _axis(split, d: int) -> str:
    named = _axes.axis_label(split.axes, d, split.ndim) if split.axes else ""
    return named if named and not named.startswith("dim") else f"dim {d}"


def _gathered_across(call: CallView, x, gathered, owner: str, reader: str) -> Violation:
    """The message, in the gather's layout (the one the plan declared): the tensor read
    may be a transpose of it."""
    split, d = gathered.split, gathered.dim
    shape = [int(s) for s in x.shape]
    whole = list(gathered.shape) or shape
    declared, actual = _axis(split, d), _axis(split, split.dim)
    local = list(gathered.local)
    by = f"{gathered.module}'s all_gather" if gathered.module else "an all_gather"
    if whole != shape:
        by = f"a transpose of {by} {whole}"
    made = f"{split.module}'s reduce-scatter" if split.module else "a reduce-scatter"
    of = f" of {actual}'s {split.whole}" if split.whole else f" of {actual}"
    sizes = ""
    if len(local) == len(whole) and local[d] and whole[d] % local[d] == 0:
        sizes = (
            f" ({declared} is {whole[d]} = {local[d]} x {whole[d] // local[d]} ranks, "
            f"{actual} is {whole[split.dim]})"
        )
    scattered = split.at_scatter(split.dim)  # in the producer's layout
    relation = (
        f"{call.op}: {owner or 'attention'} reads {shape} ({reader}'s input), {by} along "
        f"{declared} of a tensor declared Shard({d}): its local {local} is this rank's "
        f"{local[split.dim]}{of}, split by {made} along {actual} (Partial -> "
        f"Shard({scattered})), so the gather stacked the ranks' slices of {actual} as "
        f"{declared} entries{sizes} and the sequences attention mixes tokens within are not "
        "the model's"
    )
    taken = split.taken or gathered.module
    fix = f"declare Shard({split.dim}) where {taken} takes it" if taken else (
        f"declare Shard({split.dim}) where the plan takes it"
    )  # fmt: skip
    hint = (
        f"{fix} (SequenceParallel(sequence_dim={split.dim}), or input_layouts="
        f"Shard({split.dim})), to match " + _producer_hint(split, d, declared)
    )
    label = call.label_of(x, "input")
    return Violation("tp_shard_axis_mismatch", relation, (call.operand(label, x),), hint)


def _producer_hint(split, d: int, declared: str) -> str:
    """What made the split, and the other fix: shard the declared axis throughout, from the
    producer on (in the producer's layout, which the user's transposes may have changed
    since; on a residual stream every producer writes it)."""
    split_axis = _axis(split, split.dim)
    if not split.module:
        return (
            f"the reduce-scatter along {split_axis}; or shard {declared} throughout: scatter "
            f"it where the tensor is made, and declare Shard({d}) wherever the plan takes it"
        )
    was, other = split.at_scatter(split.dim), split.at_scatter(d)
    moved = f" (its dim {was} is dim {split.dim} here)" if was != split.dim else ""
    return (
        f"RowwiseParallel(output_layouts=Shard({was})) on {split.module}{moved}; or shard "
        f"{declared} throughout: RowwiseParallel(output_layouts=Shard({other})) on "
        f"{split.module} and every other producer of this tensor, Shard({d}) wherever the plan "
        "takes it"
    )
