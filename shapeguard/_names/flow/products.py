"""Contractions: matmul, bmm, baddbmm, linear, einsum; what a query-key product says."""

from ... import _ops
from .. import dims as D
from ..dims import BATCH, COPY, FEATURE, STRUCTURE, TOKEN, Axis
from .base import Made, _claim, _is_tensor, _tag_of, _tags, propagates

# Products that add an input to theirs: beta * input + alpha * (b1 @ b2).
_BADDBMM, _ADDMM = _ops.by_name("baddbmm"), _ops.by_name("addmm")


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
    if BATCH in (D.kind_of(rows), D.kind_of(cols)) and D.roots_of(rows) != D.roots_of(cols):
        return None  # examples against other examples (CLIP's image-text logits)
    if TOKEN in (kr, kc) or FEATURE in (ka, kb):
        return "scores"
    # Nothing known: a product of a tensor with a transposed one along their last axes.
    return "scores" if b_meta.laid_out else None


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
        if sibling is None and D.is_factor(heads) and D.strong_kind(heads[0]) == FEATURE:
            # A factor of a projection's features just outside the contracted head size,
            # split from it earlier ([heads, 3 * d_k] of a fused projection, then cut): heads.
            sibling = heads[0]
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
    if role == "scores" and not call.reported:
        q_heads = a_dims[-3] if a.dim() >= 3 else None
        k_heads = b_dims[-3] if b.dim() >= 3 else None
        claim_scores(rows, cols, ca, cb, q_heads, k_heads)
        _claim_operand_roles(am, bm)
        if rows and cols:
            tags[-2:] = ["q", "k"]
    elif role == "context":
        if bm.role is None:
            bm.role = "V"
        for atom in cb:
            if D.claim_kind(atom[0], TOKEN, STRUCTURE):
                D.set_side(atom[0].find(), k=True)
        if not call.reported:
            _claim_values(cols, b_dims[-3] if b.dim() >= 3 else None)
    return [Made(tuple(dims), _tags(tags), role)]


def _claim_values(v_cols: Axis, v_heads: Axis | None) -> None:
    """attn @ V: V's last axis is its head size, and the factor just outside it in the same
    dim (the head split) its heads, as for K in the query-key product."""
    if len(v_cols) != 1 or not D.is_factor(v_cols) or D.strong_kind(v_cols[0]) != FEATURE:
        return
    D.claim_part(v_cols[0], "d_k", STRUCTURE)
    if v_heads is None:
        return
    sibling = _sibling(v_heads, v_cols[0])
    if sibling is not None:
        name = "kv_heads" if COPY in D.kinds_in(v_heads) else "heads"
        D.claim_part(sibling, name, STRUCTURE)


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
    if call.spec is _BADDBMM or call.spec is _ADDMM:
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
            a, b = operands  # the two of them (checked above)
            role = classify_product(call, a, b, am, bm, ca, cb, rows, cols)
            if role == "scores" and not bm.laid_out:
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
