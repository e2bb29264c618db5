"""What one traced forward shows of the attention heads, for the head-permutation probe.

Each attention op is a *site*: SDPA, or a query-key product and the product of its
attention weights with V. A site keeps the axes in front of each operand's [seq,
features] (the heads, and the batch) as the trace's axis provenance has them, so
`head_layout` can read which rows of which projection make each head; where its
context is read (the output projection: the first projection that takes a tensor made
from it, with the provenance of the axis it contracts); and whether it reaches the
module's output unprojected. Nothing here keeps a tensor: axes are atoms of dims.
"""

from dataclasses import dataclass, field

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from .. import _ops
from .._names import dims as D


@dataclass(slots=True)
class Operand:
    """Q, K or V of a site: its leading axes (right-aligned with the other operands')."""

    role: str
    lead: tuple  # the axes before [seq, features]: heads, batch
    sizes: tuple[int, ...]


@dataclass(slots=True)
class Read:
    """A projection that reads a site's context: its module, the provenance of the axis
    it contracts, and the dim of its weight's contracted axis."""

    module: object
    axis: tuple
    weight_axis: D.Dim  # the Dim of the weight's input axis


@dataclass(slots=True)
class Site:
    """One attention op: its operands, and where its context goes."""

    where: str  # "matmul at model.py:12 (blocks.0.attn)"
    module: object  # the module it ran in (None: outside any)
    operands: list[Operand]
    gqa: bool = False  # SDPA's enable_gqa: fewer kv heads, each repeated for its queries
    d_v: int = 0  # V's head size
    reads: list[Read] = field(default_factory=list)
    reaches_output: bool = False
    # Where the context meets a tensor not made from it before any projection (a gate,
    # a residual): the columns of what follows no longer line up with the heads alone.
    mixed: str = ""
    name: str = ""  # the module's path, set when the trace ends


@dataclass(slots=True)
class Join:
    """An elementwise op or a join: the axes each operand brings, right-aligned with the
    output's `rank` axes (`skip`: a join's own axis, whose operands are not lined up)."""

    where: str
    rank: int
    operands: list  # (axes, sizes) per tensor operand
    skip: int | None = None


_LINEAR = _ops.by_name("linear")
_ADDMM = _ops.by_name("addmm")
_MATMULS = frozenset((_ops.by_name("matmul"), _ops.by_name("mm"), _ops.by_name("bmm")))
_BADDBMM = _ops.by_name("baddbmm")
_EINSUM = _ops.by_name("einsum")


class HeadWatch:
    """Records the sites of one traced forward (`Watch` calls `after` for every op)."""

    def __init__(self) -> None:
        self.sites: list[Site] = []
        self._scores = WeakTensorKeyDictionary()  # scores and what follows them -> site
        self._context = WeakTensorKeyDictionary()  # a context and what follows it -> site
        # Parameters an op applies along an axis without lining them up with it: a
        # Linear's bias (its weight's out dim), a norm's weight and bias (its input's last
        # axis). (id of the parameter, the dim.)
        self._paired: list[tuple[int, object]] = []
        self.contracted: list = []  # the dims of every projection's contracted weight axis
        self.params: dict[str, tuple] = {}  # parameter name -> its axes, when the trace ends
        self.paired: dict[str, object] = {}  # parameter name -> the dim it is applied along
        self.out_axes: tuple | None = None  # the first output's axes
        # A view that cut a whole dim across its factors (`x.view(b, heads, s, d_k)` of
        # [b, s, d_model]): id of each new dim -> (the atom it was cut from, the view).
        self.entangled: dict[int, tuple] = {}
        # Elementwise ops and joins of tensors of 3 or more axes: where a heads axis may
        # meet a per-head term of its own (a gate, a value residual, a positional query).
        self.joins: list[Join] = []

    def after(self, session, op: str, args, kwargs, out, where) -> None:
        """Note what op `op` did for the heads; `where()` describes it."""
        spec = _ops.lookup(op)
        module = session.module_stack[-1] if session.module_stack else None
        if spec is _ops.SDPA:
            self._sdpa(session, args, kwargs, out, where, module)
            return
        if spec.family == _ops.PRODUCT and isinstance(out, torch.Tensor):
            if self._projection(session, spec, op, args, kwargs):
                return
            if self._product(session, spec, op, args, kwargs, out, where, module):
                return
        if spec.family == _ops.VIEW and isinstance(out, torch.Tensor):
            self._view(session, args, out, where)
        if spec.family in (_ops.BINARY, _ops.JOIN) and isinstance(out, torch.Tensor):
            self._join(session, spec, args, kwargs, out, where)
        if "normalized_shape" in spec.params:
            self._norm(session, spec, args, kwargs)
        if self._scores or self._context:
            self._follow(args, kwargs, out, where)

    # -- sites -------------------------------------------------------------------------
    def _sdpa(self, session, args, kwargs, out, where, module) -> None:
        bound = _ops.bind(_ops.SDPA, args, kwargs)
        q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
            return
        if not isinstance(v, torch.Tensor) or min(q.dim(), k.dim(), v.dim()) < 3:
            return
        found = [_operand(session, r, t) for r, t in (("Q", q), ("K", k), ("V", v))]
        operands = [o for o in found if o is not None]
        if len(operands) != len(found):
            return
        gqa = bool(bound.get("enable_gqa"))
        site = Site(where(), module, operands, gqa, int(v.shape[-1]))
        self.sites.append(site)
        if isinstance(out, torch.Tensor):
            self._context[out] = site

    def _product(self, session, spec, op, args, kwargs, out, where, module) -> bool:
        meta = session.metas.get(out)
        role = meta.role if meta is not None else None
        if role not in ("scores", "context"):
            return False
        pair = _operands(spec, op, args, kwargs)
        if pair is None:
            return False
        a, b = pair
        lead_a, lead_b = _leading(spec, args, a, b)
        if role == "scores":
            q, k = _operand(session, "Q", a, lead_a), _operand(session, "K", b, lead_b)
            if q is None or k is None:
                return False
            site = Site(where(), module, [q, k])
            self.sites.append(site)
            self._scores[out] = site
            return True
        site = self._scores.get(a)
        if site is None or len(site.operands) != 2:
            return False
        v = _operand(session, "V", b, lead_b)
        if v is None:
            return False
        site.operands.append(v)
        site.d_v = int(b.shape[-1])
        self._context[out] = site
        return True

    def _projection(self, session, spec, op, args, kwargs) -> bool:
        """A projection (an operand is a 2-D weight): note its contracted axis, and the
        site whose context it reads."""
        found = _weight_operands(session, spec, op, args, kwargs)
        if found is None:
            return False
        x, w, axis, bias = found
        w_meta, x_meta = session.metas.get(w), session.metas.get(x)
        if w_meta is None or len(w_meta.dims) != 2 or len(w_meta.dims[axis]) != 1:
            return True
        weight_axis = w_meta.dims[axis][0][0]
        self.contracted.append(weight_axis)
        if isinstance(bias, torch.Tensor) and len(w_meta.dims[1 - axis]) == 1:
            self._paired.append((id(bias), w_meta.dims[1 - axis][0][0]))
        site = self._context.get(x)
        if site is not None and x_meta is not None and x_meta.dims:
            module = session.module_stack[-1] if session.module_stack else None
            site.reads.append(Read(module, x_meta.dims[-1], weight_axis))
        return True

    def _norm(self, session, spec, args, kwargs) -> None:
        """A layer or RMS norm over one whole last axis: its weight and bias scale and
        shift that axis's features one by one."""
        bound = _ops.bind(spec, args, kwargs)
        x = bound.get("input")
        if not isinstance(x, torch.Tensor):
            return
        meta = session.metas.get(x)
        if meta is None or not meta.dims or len(meta.dims[-1]) != 1:
            return
        if not D.is_whole(meta.dims[-1][0]):
            return  # a norm over a factor (d_k of every head): the same for every head
        for name in ("weight", "bias"):
            t = bound.get(name)
            if isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == x.shape[-1]:
                self._paired.append((id(t), meta.dims[-1][0][0]))

    def _join(self, session, spec, args, kwargs, out, where) -> None:
        """Note the axes each operand brings to an elementwise op or a join (right-aligned
        with the output's; a join's own axis left out)."""
        if out.dim() < 3:
            return
        if spec.family == _ops.JOIN:
            bound = _ops.bind(spec, args, kwargs)
            found = bound.get("tensors")
            tensors = list(found) if isinstance(found, list | tuple) else []
            dim = bound.get("dim", 0)
            skip = dim % out.dim() if isinstance(dim, int) else None
        else:
            tensors = [*args, *kwargs.values()]
            skip = None
        operands = []
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                continue
            meta = session.metas.get(t)
            if meta is None or len(meta.dims) != t.dim():
                return  # an operand the trace cannot read: nothing to say about it
            operands.append((meta.dims, tuple(int(n) for n in t.shape)))
        if len(operands) >= 2:
            self.joins.append(Join(where(), out.dim(), operands, skip))

    def _view(self, session, args, out, where) -> None:
        """Note the new dims of a view whose input's last axis is one whole dim: the view
        could not cut it into factors (it entangled them with another axis)."""
        x = next((a for a in args if isinstance(a, torch.Tensor)), None)
        x_meta, meta = session.metas.get(x), session.metas.get(out)
        if x_meta is None or meta is None or not x_meta.dims or len(x_meta.dims[-1]) != 1:
            return
        source = x_meta.dims[-1][0]
        if source[1] != 1 or source[2] != source[0].find().size:
            return
        had = {id(atom[0].find()) for axis in x_meta.dims for atom in axis}
        for axis in meta.dims:
            for atom in axis:
                root = atom[0].find()
                if id(root) not in had and id(root) not in self.entangled:
                    self.entangled[id(root)] = (source, where())

    def _follow(self, args, kwargs, out, where) -> None:
        """Carry a site's scores and context through the ops that follow them."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for table in (self._scores, self._context):
            sites = [table.get(t) for t in tensors]
            site = next((s for s in sites if s is not None), None)
            if site is None:
                continue
            if table is self._context:
                others = [t for t, s in zip(tensors, sites, strict=True) if s is None]
                if any(t.numel() > 1 for t in others) and not site.mixed:
                    site.mixed = where()
            for o in out if isinstance(out, tuple | list) else (out,):
                if isinstance(o, torch.Tensor):
                    table[o] = site

    def finish(self, session, model, out) -> None:
        """Read the parameters' axes and the output's while the session still has them."""
        from .tree import first_output

        names = {id(m): n for n, m in model.named_modules()}
        for site in self.sites:
            site.name = names.get(id(site.module), "") if site.module is not None else ""
        by_id = {}
        for name, p in model.named_parameters():
            meta = session.metas.get(p)
            by_id[id(p)] = name
            if meta is not None and len(meta.dims) == p.dim():
                self.params[name] = meta.dims
        for param, dim in self._paired:
            if param in by_id:
                self.paired[by_id[param]] = dim
        first = first_output(out)
        if first is not None:
            meta = session.metas.get(first)
            self.out_axes = meta.dims if meta is not None else None
            site = self._context.get(first)
            if site is not None:
                site.reaches_output = True


def _operand(session, role: str, t, lead: tuple[int, ...] | None = None) -> Operand | None:
    """`t`'s axes in front of its last two (or at the positions `lead` lists)."""
    meta = session.metas.get(t)
    if meta is None or len(meta.dims) != t.dim():
        return None
    where = tuple(range(t.dim() - 2)) if lead is None else lead
    return Operand(role, tuple(meta.dims[i] for i in where), tuple(int(t.shape[i]) for i in where))


def _operands(spec, op: str, args, kwargs):
    """The two multiplied tensors of a product, in the order of the product."""
    if spec is _BADDBMM:
        bound = _ops.bind(spec, args, kwargs)
        a, b = bound.get("batch1"), bound.get("batch2")
    elif spec is _EINSUM:
        operands = _einsum_operands(args)
        if operands is None or len(operands) != 2:
            return None
        a, b = operands
    else:
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        if len(tensors) != 2:
            return None
        a, b = tensors
        if op in spec.reflected:
            a, b = b, a
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.dim() < 3 or b.dim() < 3:
        return None  # no axis in front of [seq, features]: one head
    return a, b


def _einsum_operands(args):
    if not args or not isinstance(args[0], str):
        return None
    rest = args[1:]
    if len(rest) == 1 and isinstance(rest[0], list | tuple):
        rest = tuple(rest[0])
    return rest if all(isinstance(t, torch.Tensor) for t in rest) else None


def _leading(spec, args, a, b):
    """The positions of each operand's leading (batch-like) axes: all but the last two of
    a matmul's operands; for einsum, the letters both operands share and the output keeps,
    in the output's order."""
    if spec is not _EINSUM:
        return None, None
    equation = args[0].replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    specs = lhs.split(",")
    if not arrow or len(specs) != 2 or "." in equation:
        return (), ()
    shared = [c for c in rhs if c in specs[0] and c in specs[1]]
    return (
        tuple(specs[0].index(c) for c in shared),
        tuple(specs[1].index(c) for c in shared),
    )


def _weight_operands(session, spec, op: str, args, kwargs):
    """(input, weight, the weight's contracted axis, bias) of a projection: a Linear, a
    Conv1D's addmm, or `x @ W.T` with a 2-D weight."""
    if spec is _LINEAR:
        bound = _ops.bind(spec, args, kwargs)
        x, w = bound.get("input"), bound.get("weight")
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and w.dim() == 2:
            return x, w, 1, bound.get("bias")
        return None
    if spec is _ADDMM:
        bound = _ops.bind(spec, args, kwargs)
        x, w = bound.get("mat1"), bound.get("mat2")
    elif spec in _MATMULS:
        tensors = [t for t in args if isinstance(t, torch.Tensor)]
        if len(tensors) != 2:
            return None
        x, w = tensors
        if op in spec.reflected:
            x, w = w, x
    else:
        return None
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or w.dim() != 2:
        return None
    meta = session.metas.get(w)
    if meta is None or not meta.param:
        return None
    return x, w, 0, None
