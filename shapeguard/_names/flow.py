"""How each op family makes the axes of its outputs from the axes of its inputs.

One rule per family of the op table (`_ops.py`), registered with `@propagates`.
A rule returns, per output tensor, a `Made`: its axes (atoms, see `dims`), the
q/k tags of its sequence axes, the role data flow gives it (scores for a
query-key product, attn for their softmax, context for attn @ V) and whether
it is a rotary table. Rules also record what an op tells about its inputs: a
Linear reads its input's last axis as features, attention runs along seq_k,
an embedding's output width is d_model. Sizes name nothing here except where a
module declares them (`declared`), and only for feature axes.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import _axes, _ops
from . import dims as D
from .dims import BATCH, COPY, FEATURE, STRUCTURE, TOKEN, Axis


class Made(NamedTuple):
    dims: tuple[Axis, ...]
    tags: tuple[str | None, ...] = ()
    role: str | None = None
    rotary: bool = False
    param: bool = False
    laid_out: bool = False  # a transpose or permute chose this axis order


Rule = Callable[..., list[Made] | None]
_RULES: dict[str, Rule] = {}


def propagates(*families: str):
    def register(rule: Rule) -> Rule:
        for family in families:
            if family in _RULES:
                raise RuntimeError(f"axis rule for {family!r} registered twice")
            _RULES[family] = rule
        return rule

    return register


def propagate(call, outputs: list) -> list[Made]:
    """The axes of each output of `call` (an `OpCall`)."""
    rule = _RULES.get(call.spec.family)
    made = rule(call, outputs) if rule is not None else None
    if made is None or len(made) != len(outputs):
        made = [_fallback(call, out) for out in outputs]
    fixed = []
    for m, out in zip(made, outputs, strict=True):
        if len(m.dims) != out.dim() or any(
            D.size_of(a) != int(s) for a, s in zip(m.dims, out.shape, strict=True)
        ):
            m = _fallback(call, out)
        fixed.append(m)
    return fixed


# -- shared helpers ---------------------------------------------------------------------------
def _is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def _dim(d, ndim: int) -> int | None:
    if isinstance(d, int) and not isinstance(d, bool) and ndim:
        return d % ndim
    return None


def _tensor_args(call) -> list:
    return call.tensors()


def _first(call):
    for a in call.args:
        if _is_tensor(a):
            return a
    for v in call.kwargs.values():
        if _is_tensor(v):
            return v
    return None


# Families whose unknown members usually keep their input's axes (an activation, an
# elementwise op the table does not list); any other op's output is new.
_SHAPE_KEEPING = frozenset({_ops.OTHER, _ops.SAME, _ops.BINARY})


def _fallback(call, out) -> Made:
    """For an op of an elementwise-like family, the axes of its input of the output's
    shape, when exactly one input has it; else new axes (never a guess from a size that
    happens to coincide, as a product's output with its input's)."""
    shape = tuple(out.shape)
    if call.spec.family in _SHAPE_KEEPING:
        same = [t for t in _tensor_args(call) if tuple(t.shape) == shape]
        metas = {id(m): m for m in (call.meta_of(t) for t in same)}
        if len(metas) == 1:
            m = next(iter(metas.values()))
            return Made(m.dims, m.tags, m.role if call.spec.keeps_label else None, m.rotary)
    return Made(D.fresh_axes(shape, origin=call.op))


def _tag_of(meta, i: int):
    return meta.tags[i] if i < len(meta.tags) else None


def _tags(tags: list) -> tuple:
    return tuple(tags) if any(tags) else ()


def _main(call, out):
    """The operand an elementwise result stands for: the input of the result's shape."""
    shape = tuple(out.shape)
    tensors = _tensor_args(call)
    for t in tensors:
        if tuple(t.shape) == shape:
            return t
    return tensors[0] if tensors else None


# -- shape-preserving -----------------------------------------------------------------------------
@propagates(_ops.SAME)
def _same(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    spec = call.spec
    role = m.role if spec.keeps_label else None
    if spec.name in ("softmax", "log_softmax"):
        role = "attn" if m.role == "scores" else None
    out = []
    laid_out = m.laid_out and spec.keeps_value  # a copy keeps the chosen order
    for o in outputs:
        if tuple(o.shape) != tuple(x.shape):
            return None
        out.append(Made(m.dims, m.tags, role, spec.rotary or m.rotary, m.param, laid_out))
    return out


# -- elementwise with broadcasting --------------------------------------------------------------
@propagates(_ops.BINARY)
def _binary(call, outputs):
    tensors = _tensor_args(call)
    if not tensors:
        return None
    out = outputs[0]
    ndim = out.dim()
    metas = [call.meta_of(t) for t in tensors]
    main = _main(call, out)
    axes: list[Axis] = []
    tags: list[str | None] = []
    for pos in range(ndim):
        chosen: Axis = ()
        tag = None
        for t, m in zip(tensors, metas, strict=True):
            k = pos - (ndim - t.dim())
            if k < 0 or t.shape[k] == 1:
                continue
            axis = m.dims[k]
            if not chosen:
                chosen, tag = axis, _tag_of(m, k)
            else:
                D.line_up(chosen, axis)
                tag = tag or _tag_of(m, k)
        axes.append(chosen)
        tags.append(tag)
    main_meta = call.meta_of(main) if main is not None else metas[0]
    role = main_meta.role if call.spec.keeps_label or call.spec.makes_mask else None
    # A rotary table scaled by a number is still one; q * cos is not.
    big = [m for t, m in zip(tensors, metas, strict=True) if t.numel() > 1]
    rotary = bool(big) and all(m.rotary for m in big)
    made = Made(tuple(axes), _tags(tags), role, rotary)
    return [made for _ in outputs]


# -- views ------------------------------------------------------------------------------------------
def regroup_view(meta, src_shape, dst_shape) -> tuple[list[Axis], list[bool]]:
    """Axes of a view from `src_shape` to `dst_shape`, and per target axis whether it
    came out of an entangled group (then it is a new axis)."""
    src_shape, dst_shape = tuple(int(s) for s in src_shape), tuple(int(s) for s in dst_shape)
    out: list[Axis] = [()] * len(dst_shape)
    entangled = [False] * len(dst_shape)
    groups = _axes.view_groups(src_shape, dst_shape)
    if groups is None:
        whole = D.regroup(meta.dims, dst_shape)
        if whole is not None:
            return whole, entangled
        return [D.fresh(s, origin="view") for s in dst_shape], [True] * len(dst_shape)
    for gi, gj in groups:
        made = D.regroup([meta.dims[i] for i in gi], [dst_shape[j] for j in gj])
        if made is None:
            for j in gj:
                out[j] = D.fresh(dst_shape[j], origin="an entangled view")
                entangled[j] = True
        else:
            for j, axis in zip(gj, made, strict=True):
                out[j] = axis
    return out, entangled


@propagates(_ops.VIEW)
def _view(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    out = outputs[0]
    if call.spec.name == "view_as_complex" and x.dim() >= 1 and out.dim() == x.dim() - 1:
        return [Made(m.dims[:-1], m.tags[:-1] if m.tags else (), m.role, m.rotary, m.param)]
    if call.spec.name == "view_as_real" and out.dim() == x.dim() + 1:
        return [Made((*m.dims, D.fresh(2, origin="real and imaginary")), (), m.role, m.rotary)]
    axes, _ = regroup_view(m, x.shape, out.shape)
    _name_head_split(call, m, x.shape, out.shape, axes)
    by_axis = {a: _tag_of(m, i) for i, a in enumerate(m.dims) if a}
    tags = _tags([by_axis.get(a) for a in axes])
    return [Made(tuple(axes), tags, m.role, m.rotary, m.param)]


def _name_head_split(call, meta, src_shape, dst_shape, axes) -> None:
    """A view that cuts a feature axis into [.., heads, d_k] names the two factors, when
    the module declares those sizes (the second source of names, after structure)."""
    groups = _axes.view_groups(tuple(src_shape), tuple(dst_shape)) or []
    declared = None
    for gi, gj in groups:
        real_i = [i for i in gi if src_shape[i] != 1]
        real_j = [j for j in gj if dst_shape[j] != 1]
        if len(real_i) != 1 or len(real_j) < 2:
            continue
        if D.kind_of(meta.dims[real_i[0]]) in (TOKEN, BATCH):
            continue
        a, b = real_j[-2], real_j[-1]
        if len(axes[a]) != 1 or len(axes[b]) != 1:
            continue
        if declared is None:
            declared = {axis: size for axis, (_, size) in call.declared().items()}
        if dst_shape[b] != declared.get("d_k"):
            continue
        if dst_shape[a] == declared.get("heads"):
            heads = "heads"
        elif dst_shape[a] == declared.get("kv_heads"):
            heads = "kv_heads"
        else:
            continue
        D.claim_part(axes[b][0], "d_k", D.DECLARED)
        D.claim_part(axes[a][0], heads, D.DECLARED)


# -- layouts --------------------------------------------------------------------------------------
def layout_order(call, ndim: int) -> list[int] | None:
    """The permutation a layout op applies: output axis i is input axis order[i]."""
    op, args = call.op, call.args
    if op in ("transpose", "transpose_", "swapaxes", "swapdims"):
        bound = _ops.bind(call.spec, args, call.kwargs)
        d0, d1 = _dim(bound.get("dim0"), ndim), _dim(bound.get("dim1"), ndim)
        if d0 is None or d1 is None:
            return None
        order = list(range(ndim))
        order[d0], order[d1] = order[d1], order[d0]
        return order
    if op == "permute":
        rest = args[1:]
        dims = rest[0] if len(rest) == 1 and isinstance(rest[0], tuple | list) else rest
        dims = dims or call.kwargs.get("dims", ())
        if len(dims) != ndim:
            return None
        return [int(d) % ndim for d in dims]
    if op in ("movedim", "moveaxis"):
        bound = _ops.bind(call.spec, args, call.kwargs)
        src, dst = bound.get("source"), bound.get("destination")
        src = [src] if isinstance(src, int) else list(src or ())
        dst = [dst] if isinstance(dst, int) else list(dst or ())
        if len(src) != len(dst):
            return None
        src, dst = [s % ndim for s in src], [d % ndim for d in dst]
        rest = [i for i in range(ndim) if i not in src]
        order: list[int | None] = [None] * ndim
        for s, d in zip(src, dst, strict=True):
            order[d] = s
        it = iter(rest)
        return [o if o is not None else next(it) for o in order]
    if op in ("mT", "mH") or (op in ("t", "t_", "T", "H", "adjoint") and ndim <= 2):
        if ndim < 2:
            return list(range(ndim))
        return [*range(ndim - 2), ndim - 1, ndim - 2]
    if op in ("T", "H"):
        return list(reversed(range(ndim)))
    return None


@propagates(_ops.LAYOUT)
def _layout(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    order = layout_order(call, x.dim())
    if order is None:
        return None
    dims = tuple(m.dims[i] for i in order)
    tags = tuple(_tag_of(m, i) for i in order) if m.tags else ()
    moved = order != list(range(len(order)))
    return [Made(dims, tags, m.role, m.rotary, m.param, moved or m.laid_out)]


# -- contractions ---------------------------------------------------------------------------------
def classify_product(
    call, a, b, a_meta, b_meta, contract_a: Axis, contract_b: Axis, rows: Axis, cols: Axis
) -> str | None:
    """ "scores" for a query-key product, "context" for attention weights times values."""
    if D.size_of(contract_a) <= 1 or a_meta.param or b_meta.param:
        return None
    if a_meta.role == "attn":
        return "context"
    # Strong evidence only: a convention (a root input read as [batch, seq, features])
    # must not decide what a product is.
    ka, kb = D.strong_kind_of(contract_a), D.strong_kind_of(contract_b)
    if TOKEN in (ka, kb):
        return "context" if a_meta.role in ("attn", None) else None
    kr, kc = D.strong_kind_of(rows), D.strong_kind_of(cols)
    if FEATURE in (kr, kc) or ka not in (FEATURE, None) or kb not in (FEATURE, None):
        return None
    if TOKEN in (kr, kc) or FEATURE in (ka, kb):
        return "scores"
    # Nothing known: a product of a tensor with a transposed one along their last axes.
    return "scores" if b_meta.op in ("transpose", "mT", "permute", "swapaxes", "t") else None


def claim_scores(
    q_rows: Axis,
    k_cols: Axis,
    q_contract: Axis,
    k_contract: Axis,
    q_heads: Axis | None,
    k_heads: Axis | None,
) -> None:
    """What a query-key product says of its operands' axes."""
    _claim(q_rows, TOKEN, "seq", side="q")
    _claim(k_cols, TOKEN, "seq", side="k")
    for axis in (q_contract, k_contract):
        if len(axis) == 1 and D.claim_kind(axis[0][0], FEATURE, STRUCTURE):
            D.claim_part(axis[0], "d_k", STRUCTURE)
    # Keys whose head axis is repeated to meet the queries' (repeat_kv) have kv heads.
    k_name = "kv_heads" if k_heads and COPY in D.kinds_in(k_heads) else "heads"
    for heads, contract, name in ((q_heads, q_contract, "heads"), (k_heads, k_contract, k_name)):
        if heads is None or len(contract) != 1:
            continue
        sibling = _sibling(heads, contract[0])
        if sibling is not None:
            D.claim_part(sibling, name, STRUCTURE)


def _sibling(heads: Axis, d_k):
    """The factor of `heads` that sits just outside `d_k` in the same dim (a head split)."""
    dim, stride, size = d_k
    root = dim.find()
    for atom in heads:
        if atom[0].find() is root and atom[1] == stride * size:
            return atom
    return None


def _batch_axes(metas_shapes: list[tuple], ndim: int) -> tuple[list[Axis], list]:
    """Broadcast leading axes of several operands (right-aligned), lined up."""
    axes: list[Axis] = []
    tags: list = []
    for pos in range(ndim):
        chosen: Axis = ()
        tag = None
        for meta, shape, lead in metas_shapes:
            k = pos - (ndim - lead)
            if k < 0 or shape[k] == 1:
                continue
            axis = meta.dims[k]
            if not chosen:
                chosen, tag = axis, _tag_of(meta, k)
            else:
                D.line_up(chosen, axis)
        axes.append(chosen)
        tags.append(tag)
    return axes, tags


def _matmul(call, a, b, outputs) -> list[Made] | None:
    am, bm = call.meta_of(a), call.meta_of(b)
    if a.dim() == 0 or b.dim() == 0:
        return None
    a_dims, b_dims = am.dims, bm.dims
    a_vec, b_vec = a.dim() == 1, b.dim() == 1
    ca = a_dims[-1]
    cb = b_dims[0] if b_vec else b_dims[-2]
    rows = () if a_vec else a_dims[-2]
    cols = () if b_vec else b_dims[-1]
    if D.size_of(ca) > 1 and D.size_of(cb) > 1:
        D.line_up(ca, cb)
    a_lead = max(a.dim() - 2, 0)
    b_lead = max(b.dim() - 2, 0)
    ndim = max(a_lead, b_lead)
    batch, btags = _batch_axes([(am, tuple(a.shape), a_lead), (bm, tuple(b.shape), b_lead)], ndim)
    role = classify_product(call, a, b, am, bm, ca, cb, rows, cols)
    dims = [*batch]
    tags = list(btags)
    if not a_vec:
        dims.append(rows)
        tags.append(_tag_of(am, a.dim() - 2))
    if not b_vec:
        dims.append(cols)
        tags.append(None)
    if role == "scores":
        q_heads = a_dims[-3] if a.dim() >= 3 else None
        k_heads = b_dims[-3] if b.dim() >= 3 else None
        claim_scores(rows, cols, ca, cb, q_heads, k_heads)
        _claim_operand_roles(am, bm)
        if rows and cols and D.roots_of(rows) == D.roots_of(cols):
            tags[-2:] = ["q", "k"]
    elif role == "context":
        if bm.role is None:
            bm.role = "V"
        for atom in cb:
            if D.claim_kind(atom[0], TOKEN, STRUCTURE):
                atom[0].find().k_side = True
    return [Made(tuple(dims), _tags(tags), role)]


def _claim_operand_roles(qm, km) -> None:
    if qm.role is None:
        qm.role = "Q"
    if km.role is None:
        km.role = "K"


@propagates(_ops.PRODUCT)
def _product(call, outputs):
    op = call.spec.name
    args = call.args
    if op == "linear":
        return _linear(call)
    if op == "einsum":
        return _einsum(call)
    if op == "outer" and len(args) >= 2:
        am, bm = call.meta_of(args[0]), call.meta_of(args[1])
        return [Made((*am.dims, *bm.dims))]
    if op in ("baddbmm", "addmm"):
        bound = call.bound()
        operands = [bound.get(name) for name in call.spec.params[:3]]
        if len(operands) == 3 and all(_is_tensor(t) for t in operands):
            base_t, b1, b2 = operands
            made = _matmul(call, b1, b2, outputs)
            if made:
                base = call.meta_of(base_t)
                for pos, axis in enumerate(made[0].dims):
                    k = pos - (len(made[0].dims) - base_t.dim())
                    if k >= 0 and base_t.shape[k] != 1 and axis:
                        D.line_up(axis, base.dims[k])
            return made
        return None
    tensors = [a for a in args if _is_tensor(a)]
    if len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    if call.op in call.spec.reflected:
        a, b = b, a
    return _matmul(call, a, b, outputs)


def _linear(call):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not (_is_tensor(x) and _is_tensor(w)) or w.dim() != 2 or x.dim() == 0:
        return None
    xm, wm = call.meta_of(x), call.meta_of(w)
    w_out, w_in = wm.dims
    for axis in (w_out, w_in):
        D.claim_atoms(axis, FEATURE, D.PARAM)
    declared = call.declared()
    d_model = declared.get("d_model")
    for axis, size in ((w_out, w.shape[0]), (w_in, w.shape[1])):
        if d_model is not None and size == d_model[1] and len(axis) == 1:
            D.claim_part(axis[0], "d_model", D.DECLARED)
    last = xm.dims[-1]
    if D.kind_of(last) is None:
        D.claim_atoms(last, FEATURE, D.PARAM)
    D.line_up(last, w_in)
    return [Made((*xm.dims[:-1], w_out), xm.tags[:-1] + (None,) if xm.tags else ())]


def _einsum(call):
    args = call.args
    if not args or not isinstance(args[0], str):
        return None
    equation = args[0].replace(" ", "")
    operands = (
        list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else list(args[1:])
    )
    if not operands or not all(_is_tensor(t) for t in operands):
        return None
    lhs, _, rhs = equation.partition("->")
    specs = lhs.split(",")
    if len(specs) != len(operands) or "..." in equation:
        return None
    if not rhs and "->" not in equation:
        counts: dict[str, int] = {}
        for s in specs:
            for c in s:
                counts[c] = counts.get(c, 0) + 1
        rhs = "".join(sorted(c for c, n in counts.items() if n == 1))
    letters: dict[str, Axis] = {}
    seen_in: dict[str, list[int]] = {}
    for index, (spec, t) in enumerate(zip(specs, operands, strict=True)):
        if len(spec) != t.dim():
            return None
        m = call.meta_of(t)
        for c, axis, size in zip(spec, m.dims, t.shape, strict=True):
            seen_in.setdefault(c, []).append(index)
            if size == 1:
                continue
            if c in letters and letters[c]:
                D.line_up(letters[c], axis)
            else:
                letters[c] = axis
    dims = tuple(letters.get(c, ()) for c in rhs)
    role = None
    if len(operands) == 2:
        contracted = [c for c in seen_in if c not in rhs and len(seen_in[c]) == 2]
        only_a = [c for c in specs[0] if c in rhs and seen_in[c] == [0]]
        only_b = [c for c in specs[1] if c in rhs and seen_in[c] == [1]]
        if len(contracted) == 1 and len(only_a) == 1 and len(only_b) == 1:
            am, bm = call.meta_of(operands[0]), call.meta_of(operands[1])
            c = contracted[0]
            ca = am.dims[specs[0].index(c)]
            cb = bm.dims[specs[1].index(c)]
            rows, cols = letters.get(only_a[0], ()), letters.get(only_b[0], ())
            role = classify_product(call, *operands, am, bm, ca, cb, rows, cols)
            if role == "scores" and bm.op not in ("transpose", "mT", "permute"):
                role = role if D.kind_of(ca) == FEATURE or D.kind_of(rows) == TOKEN else None
            if role == "scores":
                shared = [x for x in rhs if x in specs[0] and x in specs[1]]
                heads_a = am.dims[specs[0].index(shared[-1])] if shared else None
                heads_b = bm.dims[specs[1].index(shared[-1])] if shared else None
                claim_scores(rows, cols, ca, cb, heads_a, heads_b)
                _claim_operand_roles(am, bm)
                if rows and cols and D.roots_of(rows) == D.roots_of(cols):
                    tags = tuple(
                        "q" if x == only_a[0] else "k" if x == only_b[0] else None for x in rhs
                    )
                    return [Made(dims, tags, role)]
    return [Made(dims, (), role)]


# -- reductions -------------------------------------------------------------------------------------
@propagates(_ops.REDUCE)
def _reduce(call, outputs):
    x = _first(call)
    if x is None:
        return None
    args = call.args
    if len(args) > 1 and _is_tensor(args[1]):  # torch.max(a, b): elementwise
        return _binary(call, outputs)
    m = call.meta_of(x)
    bound = _ops.bind(call.spec, args, call.kwargs)
    dim, keepdim = bound.get("dim"), bool(bound.get("keepdim", False))
    ndim = x.dim()
    if dim is None or isinstance(dim, bool):
        drop = set(range(ndim))
    else:
        dims = dim if isinstance(dim, tuple | list) else (dim,)
        if not all(isinstance(d, int) for d in dims):
            return None
        drop = {d % ndim for d in dims} if ndim else set()
    if keepdim:
        axes = tuple(() if i in drop else a for i, a in enumerate(m.dims))
        tags = tuple(None if i in drop else _tag_of(m, i) for i in range(ndim)) if m.tags else ()
    else:
        axes = tuple(a for i, a in enumerate(m.dims) if i not in drop)
        tags = tuple(_tag_of(m, i) for i in range(ndim) if i not in drop) if m.tags else ()
    made = Made(axes, tags)
    return [
        made if tuple(o.shape) == tuple(D.size_of(a) for a in axes) else _fallback(call, o)
        for o in outputs
    ]


# -- indexing --------------------------------------------------------------------------------------
def _slice_axis(axis: Axis, size: int) -> Axis:
    """Part of an axis along it (`x[:, :T]`): a new dim that keeps the name and kind."""
    if size == D.size_of(axis):
        return axis
    if size == 1:
        return ()
    name, rank, kind, kind_rank, origin = None, 0, None, 0, "a slice"
    sides = (False, False)
    if len(axis) == 1:
        atom = axis[0]
        root = atom[0].find()
        name = D.atom_name(atom)
        rank = (
            root.rank
            if D.is_whole(atom)
            else (root.parts or {}).get((atom[1], atom[2]), ("", 0))[1]
        )
        kind, kind_rank = root.kind, root.kind_rank
        origin = f"a slice of {root.origin}" if root.origin else "a slice"
        sides = (root.q_side, root.k_side)
        if name in ("seq_q", "seq_k"):
            name = "seq"
    elif axis:
        kind = D.kind_of(axis)
        kind_rank = D.CONVENTION if kind else 0
    made = D.fresh(size, name=name, rank=rank, kind=kind, kind_rank=kind_rank, origin=origin)
    if made:
        made[0][0].q_side, made[0][0].k_side = sides
    return made


@propagates(_ops.INDEX)
def _index(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    op = call.spec.name
    out = outputs[0]
    ndim = x.dim()
    if op == "__getitem__" and len(call.args) >= 2:
        return _getitem(call, x, m, call.args[1], out)
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    d = _dim(bound.get("dim"), ndim)
    if d is None:
        return None
    if op == "select":
        return [Made(m.dims[:d] + m.dims[d + 1 :], _drop_tag(m, d))]
    if op == "narrow":
        axes = list(m.dims)
        axes[d] = _slice_axis(m.dims[d], int(out.shape[d]))
        return [Made(tuple(axes), m.tags, m.role)]
    index = bound.get("index")
    if op == "index_select" and _is_tensor(index) and index.dim() == 1:
        axes = list(m.dims)
        axes[d] = call.meta_of(index).dims[0] if index.numel() > 1 else ()
        return [Made(tuple(axes))]
    if op in ("gather", "take_along_dim") and _is_tensor(index) and index.dim() == ndim:
        im = call.meta_of(index)
        axes = tuple(
            im.dims[i] if i == d or index.shape[i] != x.shape[i] else m.dims[i] for i in range(ndim)
        )
        return [Made(axes)]
    return None


def _drop_tag(m, d: int) -> tuple:
    return tuple(t for i, t in enumerate(m.tags) if i != d) if m.tags else ()


def _getitem(call, x, m, index, out):
    items = index if isinstance(index, tuple) else (index,)
    tensors = [i for i in items if _is_tensor(i)]
    if tensors:
        return _advanced_index(call, x, m, items, out)
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    axes: list[Axis] = []
    tags: list = []
    pos = 0
    for item in items:
        if item is None:
            axes.append(())
            tags.append(None)
        elif item is Ellipsis:
            keep = x.dim() - consumed
            if keep < 0:
                return None
            for k in range(pos, pos + keep):
                axes.append(m.dims[k])
                tags.append(_tag_of(m, k))
            pos += keep
        elif isinstance(item, slice):
            if pos >= x.dim():
                return None
            axes.append(m.dims[pos])  # sized below, from the output
            tags.append(_tag_of(m, pos))
            pos += 1
        elif isinstance(item, int) and not isinstance(item, bool):
            pos += 1
        else:
            return None
    for k in range(pos, x.dim()):
        axes.append(m.dims[k])
        tags.append(_tag_of(m, k))
    if len(axes) != out.dim():
        return None
    sized = tuple(_slice_axis(a, int(s)) for a, s in zip(axes, out.shape, strict=True))
    return [Made(sized, _tags(tags), m.role, m.rotary, m.param)]


def _advanced_index(call, x, m, items, out):
    """One integer tensor index among slices (`table[idx]`, `x[:, idx]`): the indexed
    axis becomes the index's axes; anything else is a new tensor."""
    if Ellipsis in items or None in items:
        return None
    tensors = [(k, i) for k, i in enumerate(items) if _is_tensor(i)]
    if len(tensors) != 1:
        return None
    k, index = tensors[0]
    if index.dtype == torch.bool or any(
        not (isinstance(i, slice) and i == slice(None)) for j, i in enumerate(items) if j != k
    ):
        return None
    im = call.meta_of(index)
    if k == 0 and m.param and x.dim() >= 2 and not index.dtype.is_floating_point:
        # Rows of a parameter looked up by index (a relative-position bias table): an
        # embedding, whose columns are features (the heads of a bias table).
        for axis in m.dims[1:]:
            D.claim_atoms(axis, FEATURE, D.PARAM)
    axes = (*m.dims[:k], *im.dims, *m.dims[k + 1 :])
    return [Made(tuple(axes))]


# -- joins and parts ------------------------------------------------------------------------------
@propagates(_ops.JOIN)
def _join(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    tensors = bound.get("tensors")
    if (
        not isinstance(tensors, tuple | list)
        or not tensors
        or not all(_is_tensor(t) for t in tensors)
    ):
        return None
    metas = [call.meta_of(t) for t in tensors]
    out = outputs[0]
    ndim = tensors[0].dim()
    dim = bound.get("dim", 0)
    if call.spec.name == "stack":
        d = _dim(dim, ndim + 1)
        if d is None:
            return None
        lined = _line_up_all(tensors, metas, range(ndim))
        axes = (*lined[:d], D.fresh(len(tensors), origin="stack"), *lined[d:])
        return [Made(tuple(axes))]
    d = _dim(dim, ndim)
    if d is None or out.dim() != ndim:
        return None
    lined = _line_up_all(tensors, metas, [i for i in range(ndim) if i != d])
    parts = [m.dims[d] for m in metas]
    axes = list(lined)
    axes.insert(d, _joined_axis(parts, int(out.shape[d])))
    tags = [_tag_of(metas[0], i) for i in range(ndim)]
    return [Made(tuple(axes), _tags(tags), _common_role(metas), all(m.rotary for m in metas))]


def _line_up_all(tensors, metas, positions) -> list[Axis]:
    axes = []
    for i in positions:
        chosen: Axis = ()
        for t, m in zip(tensors, metas, strict=True):
            if t.shape[i] == 1:
                continue
            if not chosen:
                chosen = m.dims[i]
            else:
                D.line_up(chosen, m.dims[i])
        axes.append(chosen)
    return axes


def _joined_axis(parts: list[Axis], size: int) -> Axis:
    """The axis a concatenation makes: a new dim, named and kinded like its parts when
    they agree (a cache of seq + new seq is seq; two halves of d_k are d_k)."""
    names = {D.axis_name(p) for p in parts if p}
    kinds = {D.kind_of(p) for p in parts if p} - {None}
    name = names.pop() if len(names) == 1 else None
    if name in ("seq_q", "seq_k"):
        name = "seq"
    kind = kinds.pop() if len(kinds) == 1 else None
    made = D.fresh(
        size,
        name=name,
        rank=D.CONVENTION if name else 0,
        kind=kind,
        kind_rank=D.CONVENTION if kind else 0,
        origin="a concatenation",
    )
    if made:
        roots = [a[0].find() for p in parts for a in p]
        made[0][0].q_side = any(r.q_side for r in roots)
        made[0][0].k_side = any(r.k_side for r in roots)
    return made


def _common_role(metas) -> str | None:
    roles = {m.role for m in metas}
    return roles.pop() if len(roles) == 1 else None


@propagates(_ops.PART)
def _part(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    ndim = x.dim()
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    d = _dim(bound.get("dim", 0), ndim)
    if d is None:
        return None
    if call.spec.name == "unbind":
        return [Made(m.dims[:d] + m.dims[d + 1 :], _drop_tag(m, d), m.role) for _ in outputs]
    made = []
    declared = None
    for out in outputs:
        if out.dim() != ndim:
            return None
        axes = list(m.dims)
        size = int(out.shape[d])
        part = _slice_axis(m.dims[d], size)
        if part is not m.dims[d] and part and D.kind_of(m.dims[d]) == FEATURE:
            if declared is None:
                declared = call.declared()
            d_model = declared.get("d_model")
            if d_model is not None and size == d_model[1] and D.atom_name(part[0]) is None:
                D.claim_part(part[0], "d_model", D.DECLARED)
        axes[d] = part
        made.append(Made(tuple(axes), m.tags, m.role, m.rotary))
    return made


# -- growth ----------------------------------------------------------------------------------------
def _copy(size: int) -> Axis:
    return D.fresh(size, kind=COPY, kind_rank=STRUCTURE, origin="a broadcast copy")


@propagates(_ops.GROW)
def _grow(call, outputs):
    x = _first(call)
    if x is None:
        return None
    m = call.meta_of(x)
    out = outputs[0]
    op = call.spec.name
    shape, new = tuple(x.shape), tuple(out.shape)
    if op in ("expand", "expand_as", "broadcast_to"):
        lead = len(new) - len(shape)
        if lead < 0:
            return None
        axes: list[Axis] = [_copy(s) for s in new[:lead]]
        for k, (old, size) in enumerate(zip(shape, new[lead:], strict=True)):
            axes.append(m.dims[k] if old == size else _copy(size))
        tags = (None,) * lead + m.tags if m.tags else ()
        return [Made(tuple(axes), tags, m.role, m.rotary)]
    if op in ("repeat", "tile"):
        reps = call.args[1:]
        if len(reps) == 1 and isinstance(reps[0], tuple | list):
            reps = tuple(reps[0])
        if not reps or not all(isinstance(r, int) for r in reps):
            return None
        reps = (1,) * (len(shape) - len(reps)) + tuple(reps)
        lead = len(reps) - len(shape)
        axes = [_copy(r) for r in reps[:lead]]
        for k, r in enumerate(reps[lead:]):
            # repeat tiles whole blocks: the copy is the outer factor.
            axes.append(D.normalize((*_copy(r), *m.dims[k])) if r > 1 else m.dims[k])
        return [Made(tuple(axes), (), m.role)]
    if op == "repeat_interleave":
        bound = _ops.bind(call.spec, call.args, call.kwargs)
        repeats, d = bound.get("repeats"), _dim(bound.get("dim"), x.dim())
        if not isinstance(repeats, int) or d is None:
            return None
        axes = list(m.dims)
        # Each element repeated in place: the copy is the inner factor.
        axes[d] = D.normalize((*m.dims[d], *_copy(repeats))) if repeats > 1 else m.dims[d]
        return [Made(tuple(axes), m.tags, m.role)]
    return None


# -- new tensors, attention, embeddings, convolutions ---------------------------------------------
@propagates(_ops.FACTORY)
def _factory(call, outputs):
    rotary = call.spec.rotary
    return [Made(D.fresh_axes(tuple(o.shape), origin=call.op), rotary=rotary) for o in outputs]


@propagates(_ops.ATTENTION)
def _attention(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    q, k, v = bound.get("query"), bound.get("key"), bound.get("value")
    if not (_is_tensor(q) and _is_tensor(k) and _is_tensor(v)):
        return None
    qm, km, vm = call.meta_of(q), call.meta_of(k), call.meta_of(v)
    for meta, role in ((qm, "Q"), (km, "K"), (vm, "V")):
        if meta.role is None:
            meta.role = role
    if call.spec is _ops.SDPA:
        return _sdpa(q, k, v, qm, km, vm, outputs)
    return _mha(q, k, qm, km, vm, outputs)


def _claim(axis: Axis, kind: str, name: str | None = None, side: str = "") -> None:
    """What attention says of an axis; never against a kind a parameter already gave it."""
    if not axis:
        return
    if any(not D.claim_kind(atom[0], kind, STRUCTURE) for atom in axis):
        return
    if name is not None and len(axis) == 1:
        D.claim_part(axis[0], name, STRUCTURE)
    for atom in axis:
        root = atom[0].find()
        if side == "q":
            root.q_side = True
        elif side == "k":
            root.k_side = True


def _sdpa(q, k, v, qm, km, vm, outputs):
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        return None
    _claim(qm.dims[-1], FEATURE, "d_k")
    _claim(km.dims[-1], FEATURE, "d_k")
    _claim(qm.dims[-2], TOKEN, "seq", side="q")
    _claim(km.dims[-2], TOKEN, "seq", side="k")
    if k.shape[-2] == v.shape[-2] and k.shape[-2] > 1:
        D.line_up(km.dims[-2], vm.dims[-2])
    if q.dim() >= 4:
        kv = "kv_heads" if k.shape[-3] < q.shape[-3] else "heads"
        _claim(qm.dims[-3], FEATURE, "heads")
        _claim(km.dims[-3], FEATURE, kv)
        _claim(vm.dims[-3], FEATURE, kv)
    if q.dim() >= 3:
        for meta in (qm, km, vm):
            if len(meta.dims[0]) == 1:
                _claim(meta.dims[0], BATCH)
    dims = (*qm.dims[:-1], vm.dims[-1])
    return [Made(dims, qm.tags[:-1] + (None,) if qm.tags else (), "context")]


def _mha(q, k, qm, km, vm, outputs):
    if q.dim() not in (2, 3) or k.dim() != q.dim():
        return None
    _claim(qm.dims[0], TOKEN, side="q")
    _claim(km.dims[0], TOKEN, side="k")
    if q.dim() == 3:
        for meta in (qm, km, vm):
            _claim(meta.dims[1], BATCH)
    made = [Made(qm.dims)]
    for extra in outputs[1:]:
        if q.dim() == 3 and extra.dim() >= 3:
            dims = (qm.dims[1], *([()] * (extra.dim() - 3)), qm.dims[0], km.dims[0])
        else:
            dims = D.fresh_axes(tuple(extra.shape))
        made.append(Made(tuple(dims), (), "attn"))
    return made


@propagates(_ops.EMBEDDING)
def _embedding(call, outputs):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    ids, w = bound.get("input"), bound.get("weight")
    if not (_is_tensor(ids) and _is_tensor(w)) or w.dim() != 2:
        return None
    im, wm = call.meta_of(ids), call.meta_of(w)
    width = wm.dims[1]
    D.claim_atoms(width, FEATURE, D.PARAM)
    declared = call.declared()
    for axis, names in (("d_model", "d_model"), ("heads", "heads")):
        hit = declared.get(axis)
        if hit is not None and hit[1] == w.shape[1] and len(width) == 1:
            D.claim_part(width[0], names, D.DECLARED)
            break
    if ids.dim() == 1 and ids.numel() > 1:
        D.claim_atoms(im.dims[0], TOKEN, STRUCTURE)
    return [Made((*im.dims, width), im.tags + (None,) if im.tags else ())]


_SPATIAL = {1: (None,), 2: ("height", "width"), 3: ("depth", "height", "width")}


def _im2col(call, outputs):
    """F.unfold: [N, C, H, W] -> [N, C * kh * kw, L], the L patch positions last."""
    x = _first(call)
    out = outputs[0]
    if x is None or x.dim() != 4 or out.dim() != 3:
        return None
    xm = call.meta_of(x)
    channels = xm.dims[1]
    D.claim_atoms(
        channels, FEATURE, STRUCTURE, "channels" if D.axis_name(channels) is None else None
    )
    for axis, name in ((xm.dims[2], "height"), (xm.dims[3], "width")):
        D.claim_atoms(axis, TOKEN, STRUCTURE, name if D.axis_name(axis) is None else None)
    kernel = int(out.shape[1]) // max(D.size_of(channels), 1)
    features = D.normalize(
        (
            *channels,
            *D.fresh(kernel, kind=FEATURE, kind_rank=STRUCTURE, origin="unfold kernel positions"),
        )
    )
    patches = D.fresh(
        int(out.shape[2]),
        name="seq",
        rank=STRUCTURE,
        kind=TOKEN,
        kind_rank=STRUCTURE,
        origin="unfold patches",
    )
    return [Made((xm.dims[0], features, patches))]


@propagates(_ops.CONV)
def _conv(call, outputs):
    if call.spec.name == "unfold":
        return None if call.is_method else _im2col(call, outputs)
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not (_is_tensor(x) and _is_tensor(w)):
        return None
    spatial = w.dim() - 2
    out = outputs[0]
    if x.dim() not in (spatial + 1, spatial + 2) or out.dim() != x.dim():
        return None
    xm, wm = call.meta_of(x), call.meta_of(w)
    lead = x.dim() - spatial - 1  # 1 with a batch axis, 0 without
    channels = xm.dims[lead]
    D.claim_atoms(
        channels, FEATURE, STRUCTURE, "channels" if D.axis_name(channels) is None else None
    )
    D.claim_atoms(wm.dims[0], FEATURE, D.PARAM)
    out_channels = wm.dims[0]
    declared = call.declared().get("d_model")
    if declared is not None and declared[1] == w.shape[0] and len(out_channels) == 1:
        D.claim_part(out_channels[0], "d_model", D.DECLARED)
    elif len(out_channels) == 1:
        D.claim_part(out_channels[0], "channels", D.PARAM)
    axes = [*xm.dims[:lead], out_channels]
    names = _SPATIAL.get(spatial, (None,) * spatial)
    for i in range(spatial):
        src = xm.dims[lead + 1 + i]
        name = names[i]
        if D.axis_name(src) is None and name is not None:
            D.claim_atoms(src, TOKEN, STRUCTURE, name)
        else:
            D.claim_atoms(src, TOKEN, STRUCTURE)
        size = int(out.shape[lead + 1 + i])
        if size == D.size_of(src):
            axes.append(src)
        else:
            # Strided: new positions, read from the old ones (patches, frames).
            keep = D.axis_name(src)
            axes.append(
                D.fresh(
                    size,
                    name=keep or name,
                    rank=STRUCTURE if (keep or name) else 0,
                    kind=TOKEN,
                    kind_rank=STRUCTURE,
                    origin=f"{call.op} positions",
                )
            )
    return [Made(tuple(axes))]


# -- torch's attention modules, recorded whole --------------------------------------------------
def _batch_first(module) -> bool:
    """The layout a torch attention module reads, from itself or its attention layers."""
    for candidate in (
        module,
        getattr(module, "self_attn", None),
        *(getattr(layer, "self_attn", None) for layer in getattr(module, "layers", ())[:1]),
        *(
            getattr(layer, "self_attn", None)
            for part in (getattr(module, "encoder", None),)
            for layer in getattr(part, "layers", ())[:1]
        ),
    ):
        flag = getattr(candidate, "batch_first", None)
        if isinstance(flag, bool):
            return flag
    return False


@propagates(_ops.COMPOSITE)
def _composite(call, outputs):
    """nn.MultiheadAttention and the nn.Transformer* layers: their documented layout
    ([batch, seq, d_model] with batch_first, else [seq, batch, d_model]) names the axes
    of every 3-D input; each output has the axes of the input of its shape (the query,
    or the target of nn.Transformer)."""
    module = call.module
    batch_first = _batch_first(module) if module is not None else False
    tensors = [t for t in _tensor_args(call) if t.is_floating_point() and t.dim() == 3]
    metas = [call.meta_of(t) for t in tensors]
    is_mha = call.spec.name == "MultiheadAttention"
    for index, meta in enumerate(metas):
        seq, batch = (1, 0) if batch_first else (0, 1)
        side = ("q" if index == 0 else "k") if is_mha else ""
        _claim(meta.dims[seq], TOKEN, side=side)
        _claim(meta.dims[batch], BATCH)
        _claim(meta.dims[2], FEATURE)
    made = []
    for out in outputs:
        source = None
        candidates = list(zip(tensors, metas, strict=True))
        if call.spec.name == "Transformer" and len(candidates) >= 2:
            candidates = [candidates[1], candidates[0]]  # the output is the target's
        for t, m in candidates:
            if tuple(t.shape) == tuple(out.shape):
                source = m
                break
        if source is not None:
            made.append(Made(source.dims))
        elif is_mha and tensors and out.dim() >= 3:
            q, k = metas[0], metas[-1]
            seq, batch = (1, 0) if batch_first else (0, 1)
            dims = (q.dims[batch], *([()] * (out.dim() - 3)), q.dims[seq], k.dims[seq])
            made.append(Made(tuple(dims), (), "attn"))
        else:
            made.append(_fallback(call, out))
    return made
