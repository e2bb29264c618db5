"""What one traced forward tells the probes: causal, masked, positional, its projections."""

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from ..checks import mask_semantics
from ..checks.mask_semantics import mask_uses
from .contractions import note_contracted
from .cuts import CUTTING, note_cuts
from .head_sites import HeadWatch
from .index_flow import IndexFlow
from .tree import first_output

# The ops whose masks `mask_uses` reads: the only ones worth building an OpCall for.
_MASKING_OPS = frozenset(s for op in mask_semantics.MASKING for s in op.spellings)
# Ops that make a positional term, and ops that read one out of a table (op table flags).
_POSITIONAL_OPS = _ops.spellings_where(positional=True)
_TABLE_READS = _ops.spellings_where(reads_table=True)
_LINEAR = _ops.by_name("linear")
_EMBEDDING = _ops.by_name("embedding")
# Products a projection module computes its output with (nn.Linear, Conv1D's addmm,
# FalconLinear's @); elementwise ops, which may mask attention weights after the softmax.
_PROJECTING = _ops.family_ops(_ops.PRODUCT)
_WEIGHT_MASKING = _ops.family_ops(_ops.BINARY)
# Ops that pick or write rows of an axis by the values of an index tensor (a graph's
# message passing reads its nodes this way), and t[index].
_ADDRESSING = _ops.spellings_where(addresses=True)
_GETITEM = _ops.by_name("__getitem__")


class Watch:
    """Notes, while a shapeguard session traces one forward, what the probes need to
    know: whether the module is causal, masked or positional, which Linears make Q, K,
    V and read the context, and (for locating a failure) every op's output."""

    def __init__(self, session, *, keep_values: bool = False) -> None:
        self.session = session
        self.causal = ""  # why the module is causal, when it is
        # The query axes (root dims) of the attention a causal mask or is_causal applied
        # to, and of those a mask applied to that is not causal: which sequence is causal.
        self.causal_queries: list = []
        self.open_queries: list = []
        self.masked = ""  # where a mask is applied
        self.positional = ""  # where a positional term is computed
        self.linears: list[tuple] = []  # (module, input role, output role)
        self.embedded: list[tuple] = []  # (axes of the ids an embedding read, table rows)
        # id(Linear) -> (op, output shapes) of the first op that read its output: how a
        # packed projection is cut into Q, K, V.
        self.first_use: dict[int, tuple] = {}
        self._made_by = WeakTensorKeyDictionary()
        self.mask_uses: list = []  # masks.MaskUse: how each op applied its mask
        # (mask, how it was applied, its MaskUse, its causal pattern): read once
        self._last_mask: tuple | None = None
        self.values: list[tuple] | None = [] if keep_values else None
        self.heads = HeadWatch()  # the attention ops' heads, for head permutation
        # (root dim of the axis, root dims of the index, where): rows picked or written
        # along an axis by an index tensor's values.
        self.addressed: list[tuple] = []
        # Which integer inputs each index's values come from (`index_flow`), and per
        # addressing op (root dim of the axis, those inputs' paths, where): the graph probe
        # reads an edge list's nodes from it (`graph_layout`).
        self.index_flow = IndexFlow()
        self.addressed_by: list[tuple] = []
        # The first op that reads rows of a parameter or buffer by an index no input's
        # values make (a position table, an embedding of arange): rows have identities.
        self.own_rows = ""
        self.made_positions = ""  # the first op that makes positions (arange, sin, cos)
        # (dim, where) for each dim a matrix product contracted (`contractions`).
        self.contracted: list[tuple] = []
        # {id of a token axis's dim: cuts.Cut}: the last op that took it out of its output.
        self.cuts: dict = {}
        # A crash of this watch's own code (`runs.describe_crash`): what it noted is not to
        # be trusted, and the probes say so instead of running on it.
        self.broken = ""
        self._observation = None

    def __enter__(self):
        """Observe `self.session` (`Session.observe`) until the block ends, however it ends."""
        self._observation = self.session.observe(self)
        return self

    def __exit__(self, *exc):
        observation, self._observation = self._observation, None
        if observation is not None:
            observation.close()

    def _where(self, count: int, op: str) -> str:
        events = self.session.trace.events
        if len(events) > count and events[-1].op == op:
            return describe_event(events[-1])
        return op

    # `before` and `after`: the session's observer calls (`_trace.observe.Observer`). A
    # crash of the watch's own code never reaches the module's forward: it is noted.
    def before(self, func, op: str, args, kwargs) -> None:
        if self.broken:
            return
        try:
            self._before(func, op, args, kwargs)
        except Exception as error:
            self._broke(error)

    def after(self, func, op: str, args, kwargs, out, count: int) -> None:
        if self.broken:
            return
        try:
            self._after(func, op, args, kwargs, out, count)
        except Exception as error:
            self._broke(error)

    def _broke(self, error: Exception) -> None:
        from .runs import describe_crash

        self.broken = describe_crash(error)

    def _before(self, func, op: str, args, kwargs) -> None:
        if _ops.declared(op) is _EMBEDDING:
            self._embedding(args, kwargs)
        if op not in _MASKING_OPS and op not in _WEIGHT_MASKING:
            return
        from .._trace.call import OpCall

        call = OpCall(self.session, func, op, args, kwargs, None)
        bound = call.bound()
        if bound.get("is_causal") is True:
            from . import masks

            self.causal = self.causal or f"{op}(is_causal=True)"
            _note_root(self.causal_queries, masks.key_axis(call, op)[1])
        for use in mask_uses(call):
            self.masked = self.masked or use.op
            self._mask_use(call, use)
        self._weights_masked(call)

    def _weights_masked(self, call) -> None:
        """A mask applied after the softmax: recorded for the probes (its polarity)."""
        from . import masks

        found = masks.after_softmax(call)
        if found is None:
            return
        op, hidden, target = found
        self.masked = self.masked or op
        keys, queries = masks.key_axis(call, "masked_fill")
        unseen = masks.unseen_keys(hidden, target)
        kept = masks.kept(hidden, self.mask_uses)
        extra = masks.beyond_padding(hidden, target, unseen)
        self.mask_uses.append(masks.MaskUse(op, target, unseen, keys, queries, kept, extra))

    def _mask_use(self, call, use) -> None:
        """What the probes keep of a mask use: its padding, its key axis, causal or not."""
        from . import masks

        # Every layer applies the same mask tensor: read its values once.
        same = self._last_mask
        if same is not None and same[0] is use.mask and same[1] == (use.op, use.target, use.kind):
            keys, queries = masks.key_axis(call, use.op)
            if same[2] is not None:
                prev = same[2]
                self.mask_uses.append(
                    masks.MaskUse(
                        use.op, use.target, prev.unseen, keys, queries, prev.hidden, prev.extra
                    )
                )
            _note_root(self.causal_queries if same[3] else self.open_queries, queries)
            return
        summary = None
        keys, queries = masks.key_axis(call, use.op)
        if use.kind != "combined":
            unseen = masks.unseen_keys(use.hidden, use.target)
            hidden = masks.kept(use.hidden, self.mask_uses)
            extra = masks.beyond_padding(use.hidden, use.target, unseen)
            summary = masks.MaskUse(use.op, use.target, unseen, keys, queries, hidden, extra)
            self.mask_uses.append(summary)
        shape = masks.causal_pattern(use.hidden, use.target)
        if use.mask is not None:
            self._last_mask = (use.mask, (use.op, use.target, use.kind), summary, shape)
        _note_root(self.causal_queries if shape else self.open_queries, queries)
        if shape == "triangle":
            self.causal = self.causal or f"a triangular mask in {use.op}"
        elif shape == "band":
            self.causal = self.causal or f"a mask near the diagonal in {use.op}"

    def _embedding(self, args, kwargs) -> None:
        ids = args[0] if args else kwargs.get("input")
        table = args[1] if len(args) > 1 else kwargs.get("weight")
        if not isinstance(ids, torch.Tensor) or not isinstance(table, torch.Tensor):
            return
        meta = self.session.metas.get(ids)
        if meta is not None and table.dim() == 2:
            self.embedded.append((meta.dims, int(table.shape[0])))

    def _after(self, func, op: str, args, kwargs, out, count: int) -> None:
        session = self.session
        self.heads.after(session, op, args, kwargs, out, lambda: self._where(count, op))
        if op in _ADDRESSING or _ops.declared(op) is _GETITEM:
            self._addressing(op, args, kwargs, count)
        note_contracted(self.contracted, session, op, args, lambda: self._where(count, op))
        if op in CUTTING:
            note_cuts(self.cuts, session, op, args, out, lambda: self._where(count, op))
        self.index_flow.after(args, kwargs, out)
        table = op in _TABLE_READS and _reads_a_table(session, args)
        if op in _POSITIONAL_OPS or table:
            self.positional = self.positional or self._where(count, op)
        if op in _POSITIONAL_OPS:
            self.made_positions = self.made_positions or self._where(count, op)
        embedding = _ops.declared(op) is _EMBEDDING
        if (embedding or (table and _picks_rows(args, out))) and not self._indexed_by_inputs(args):
            self.own_rows = self.own_rows or self._where(count, op)
        if self._made_by:
            for a in args:
                key = self._made_by.get(a) if isinstance(a, torch.Tensor) else None
                if key is None or key in self.first_use:
                    continue
                outs = out if isinstance(out, tuple | list) else (out,)
                if isinstance(out, torch.Tensor) and out.dim() and out.shape[-1] == a.shape[-1]:
                    self._made_by[out] = key  # unsqueeze, a cast: still the projection's
                    continue
                shapes = tuple(tuple(o.shape) for o in outs if isinstance(o, torch.Tensor))
                self.first_use[key] = (op, shapes)
        if op in _PROJECTING and session.module_stack and isinstance(out, torch.Tensor):
            module = session.module_stack[-1]
            weight = getattr(module, "weight", None)
            if _ops.declared(op) is _LINEAR or (
                isinstance(weight, torch.Tensor) and weight.dim() == 2
            ):
                self._made_by[out] = id(module)  # GPT-2's Conv1D (addmm), FalconLinear (@)
        if _ops.declared(op) is _LINEAR and session.module_stack and isinstance(out, torch.Tensor):
            meta_in, meta_out = session.metas.get(args[0]), session.metas.get(out)
            self.linears.append(
                (
                    session.module_stack[-1],
                    meta_in.role if meta_in else None,
                    meta_out.role if meta_out else None,
                )
            )
        out = first_output(out)  # nn.MultiheadAttention's op returns (output, weights)
        if self.values is not None and out is not None:
            meta = session.metas.get(out)
            axes = meta.axes if meta else ()
            self.values.append((op, self._where(count, op), out.detach().clone(), axes))

    def _addressing(self, op: str, args, kwargs, count: int) -> None:
        names = ("input", "dim", "index")
        if _ops.declared(op) is _GETITEM:  # x[index]: rows of axis 0 by an index's values
            args = (args[0], 0, args[1]) if len(args) == 2 else ()
        bound = dict(zip(names, args, strict=False))
        bound.update({k: kwargs[k] for k in names if k in kwargs})
        x, dim, index = (bound.get(k) for k in names)
        if not (isinstance(x, torch.Tensor) and isinstance(index, torch.Tensor)):
            return
        if not isinstance(dim, int) or index.is_floating_point() or index.dtype == torch.bool:
            return
        x_meta, index_meta = self.session.metas.get(x), self.session.metas.get(index)
        if x_meta is None or index_meta is None or not -x.dim() <= dim < x.dim():
            return
        axis = x_meta.dims[dim]
        if len(axis) != 1:
            return
        index_roots = [atom[0].find() for a in index_meta.dims for atom in a]
        where = self._where(count, op)
        self.addressed.append((axis[0][0].find(), index_roots, where))
        by = self.index_flow.sources(index)
        self.addressed_by.append((axis[0][0].find(), by, where))

    def _indexed_by_inputs(self, args) -> bool:
        """Whether an integer operand of a table read carries an input's values."""
        return any(self.index_flow.sources(a) for a in args if isinstance(a, torch.Tensor))


def _note_root(roots: list, axis) -> None:
    """Keep the dim of a scores' query axis (one whole dim), once."""
    if len(axis) != 1:
        return
    atom = axis[0]
    root = atom[0].find()
    if atom[1] == 1 and atom[2] == root.size and not any(r is root for r in roots):
        roots.append(root)


def _reads_a_table(session, args) -> bool:
    """Indexing a parameter or a module buffer: a position table, usually."""
    if not args or not isinstance(args[0], torch.Tensor):
        return False
    table = args[0]
    if isinstance(table, torch.nn.Parameter):
        return True
    meta = session.metas.get(table)
    if meta is not None:
        return bool(meta.buffer)
    return any(buf is table for module in session.module_stack for buf in module._buffers.values())


def _picks_rows(args, out) -> bool:
    """Whether a read of a table keeps fewer elements than it holds (rows picked, not a
    view of the whole, as `a[:, None, :]` is)."""
    return isinstance(out, torch.Tensor) and out.numel() < args[0].numel()


def describe_event(event) -> str:
    """`view at model.py:12 (blocks.0.attn)`: how a failed probe names a traced op."""
    where = f"{event.op} at {event.location}" if event.location else event.op
    module = event.module or event.module_type
    return f"{where} ({module})" if module else where
