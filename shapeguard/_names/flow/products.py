"""Contractions: matmul, bmm, baddbmm, linear, einsum; what a query-key product says."""

from ... import _ops
from ..._memo import Memo
from ..._values import is_tensor
from .. import dims as D
from .. import subscripts
from ..dims import BATCH, COPY, FEATURE, STRUCTURE, TOKEN, Axis
from .base import Made, claim_axis, propagates, tag_at, tags_if_any

# Products that add an input to theirs: beta * input + alpha * (b1 @ b2).
_BADDBMM, _ADDMM = _ops.by_name("baddbmm"), _ops.by_name("addmm")


# -- contractions ---------------------------------------------------------------------------------
def classify_product(
    call,
    a,
    b,
    a_meta,
    b_meta,
    contract_a: Axis,
    contract_b: Axis,
    rows: Axis,
    cols: Axis,
    query_heads: int = 0,
) -> str | None:
    """ "scores" for a query-key product, "context" for attention weights times values.

    A product is a query-key product only where its structure says so: features contracted
    with features (a parameter or structure says so of one side at least, or nothing is
    known and the keys were transposed for it), and keys that are positions of each example:
    more than one column (a state times a vector, `[B*H, head_dim, state] @ [B*H, state, 1]`,
    pairs nothing), known from the model's inputs or laid out for the product, and every
    example axis of the queries among the keys' axes (a weight shared by the examples, such
    as MLA's absorbed `W_uk` [heads, d, rank] against q [batch, heads, seq, d], is no key).
    The left operand holds the queries by the order `q @ k^T` is written in: where the
    operands' names say the opposite (`k @ q^T`), that order is no evidence either.
    `query_heads` counts the queries' axes the keys lack on evidence (an einsum letter for
    the heads that only the queries carry: multi-query keys shared by every head).
    """
    if D.size_of(contract_a) <= 1 or a_meta.param or b_meta.param:
        return None
    if a_meta.role == "attn":
        return "context"
    # Strong evidence only: a convention (a root input read as [batch, seq, features])
    # must not decide what a product is.
    ka, kb = D.strong_kind_of(contract_a), D.strong_kind_of(contract_b)
    if TOKEN in (ka, kb):
        return "context" if a_meta.role in ("attn", None) else None
    if not _keys_per_example(a, b, a_meta, b_meta, cols, query_heads):
        return None
    if a_meta.role == "K" or b_meta.role == "Q":
        # Which operand holds the queries is the order `q @ k^T` is written in; where the
        # names say keys times queries, that order is no evidence, and nothing is claimed.
        return None
    kr, kc = D.strong_kind_of(rows), D.strong_kind_of(cols)
    if FEATURE in (kr, kc) or ka not in (FEATURE, None) or kb not in (FEATURE, None):
        return None
    if BATCH in (D.kind_of(rows), D.kind_of(cols)) and D.roots_of(rows) != D.roots_of(cols):
        return None  # examples against other examples (CLIP's image-text logits)
    if TOKEN in (kr, kc) or FEATURE in (ka, kb):
        return "scores"
    # Nothing known: a product of a tensor with a transposed one along their last axes.
    return "scores" if b_meta.laid_out else None


def _keys_per_example(a, b, a_meta, b_meta, cols: Axis, query_heads: int = 0) -> bool:
    """The right operand can be the keys of the left one's queries: it has columns, they
    are an activation's (a kind known for them, or laid out for this product by a transpose
    in the trace), and it varies along every example axis the queries have."""
    if not cols or (D.kind_of(cols) is None and not b_meta.laid_out):
        return False
    if b.dim() + query_heads < a.dim():
        return False  # shared along a leading axis of the queries: a weight
    examples = {
        id(root) for axis in a_meta.dims for atom in axis if (root := atom[0].find()).kind == BATCH
    }
    if not examples:
        return True
    keyed = {id(atom[0].find()) for axis in b_meta.dims for atom in axis}
    return examples <= keyed


def claim_scores(
    q_rows: Axis,
    k_cols: Axis,
    q_contract: Axis,
    k_contract: Axis,
    q_heads: Axis | None,
    k_heads: Axis | None,
) -> None:
    """What a query-key product says of its operands' axes."""
    claim_axis(q_rows, TOKEN, "seq", side="q")
    claim_axis(k_cols, TOKEN, "seq", side="k")
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
                chosen, tag = axis, tag_at(meta, k)
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
        tags.append(tag_at(am, a.dim() - 2))
    if not b_vec:
        dims.append(cols)
        tags.append(None)
    if role == "scores" and not call.reported:
        q_heads = a_dims[-3] if a.dim() >= 3 else None
        k_heads = b_dims[-3] if b.dim() >= 3 else None
        claim_scores(rows, cols, ca, cb, q_heads, k_heads)
        _claim_operand_roles(am, bm)
        if not (a_vec or b_vec):  # a one-token step's query axis (size 1) is the queries too
            tags[-2:] = ["q", "k"]
    elif role == "context":
        if bm.role is None:
            bm.role = "V"
        for atom in cb:
            if D.claim_kind(atom[0], TOKEN, STRUCTURE):
                D.set_side(atom[0].find(), k=True)
        if not call.reported:
            _claim_values(cols, b_dims[-3] if b.dim() >= 3 else None)
    return [Made(tuple(dims), tags_if_any(tags), role)]


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
        if len(operands) == 3 and all(is_tensor(t) for t in operands):
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
    tensors = [a for a in args if is_tensor(a)]
    if len(tensors) < 2:
        return None
    a, b = tensors[0], tensors[1]
    if call.op in call.spec.reflected:
        a, b = b, a
    return _matmul(call, a, b, outputs)


def _linear(call):
    bound = _ops.bind(call.spec, call.args, call.kwargs)
    x, w = bound.get("input"), bound.get("weight")
    if not (is_tensor(x) and is_tensor(w)) or w.dim() != 2 or x.dim() == 0:
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
    """The output's axes by letter, and what a two-operand product's letters say: which
    letter the queries run along, which the keys, which the product keeps apart (heads)."""
    args = call.args
    if not args or not isinstance(args[0], str):
        return None
    operands = (
        list(args[1]) if len(args) == 2 and isinstance(args[1], list | tuple) else list(args[1:])
    )
    if not operands or not all(is_tensor(t) for t in operands):
        return None
    equation = subscripts.parse(args[0], [t.dim() for t in operands])
    if equation is None:
        return None
    if len(operands) == 1:
        permuted = _permutation(call.meta_of(operands[0]), equation.specs[0], equation.out)
        if permuted is not None:
            return [permuted]
    letters: dict[str, Axis] = {}
    for spec, t in zip(equation.specs, operands, strict=True):
        m = call.meta_of(t)
        for c, axis, size in zip(spec, m.dims, t.shape, strict=True):
            if size == 1:
                continue
            if c in letters and letters[c]:
                D.line_up(letters[c], axis)
            else:
                letters[c] = axis
    dims = tuple(letters.get(c, ()) for c in equation.out)
    made = _einsum_product(call, operands, letters, dims) if len(operands) == 2 else None
    return [made or Made(dims)]


def _permutation(m, spec: str, out: str) -> Made | None:
    """A one-operand einsum that only reorders its axes (`nhwpqc->nchpwq`, diffusers'
    unpatchify) is a permute written with subscripts: the same axes, tags and facts, and an
    order the code chose (`laid_out`), as the layout rule makes for `permute`."""
    if len(set(spec)) != len(spec) or sorted(spec) != sorted(out):
        return None
    order = [spec.index(c) for c in out]
    tags = tuple(tag_at(m, i) for i in order) if m.tags else ()
    moved = order != list(range(len(order)))
    dims = tuple(m.dims[i] for i in order)
    return Made(dims, tags, m.role, m.rotary, m.param, moved or m.laid_out)


def _einsum_product(call, operands, letters: dict, dims) -> Made | None:
    """A two-operand einsum with one contracted letter and one row letter per side: the
    query-key product or attention weights times values, read from the letters."""
    product = subscripts.product(call.args[0], [t.dim() for t in operands])
    if product is None or not (len(product.contracted) == len(product.cols) == 1):
        return None
    a, b = operands
    am, bm = call.meta_of(a), call.meta_of(b)
    spec_a, spec_b = product.equation.specs
    c = product.contracted
    ca, cb = am.dims[spec_a.index(c)], bm.dims[spec_b.index(c)]
    row, own_heads = product.rows, None
    if len(row) == 2 and am.role != "attn":  # weights times values shared by the heads pass
        own_heads = _query_heads_letter(row, spec_a, am.dims, ca)
        if own_heads is None:
            return None
        row = row.replace(own_heads, "")
    if len(row) != 1 and am.role != "attn":
        return None
    rows, cols = letters.get(row, ()), letters.get(product.cols, ())
    role = classify_product(
        call, a, b, am, bm, ca, cb, rows, cols, query_heads=0 if own_heads is None else 1
    )
    if role == "context" and len(row) == 2 and not call.reported:
        _claim_shared_values(cols)
    if role != "scores":
        return Made(dims, (), role) if role else None
    heads = own_heads or _heads_letter(product.batch, spec_a, am.dims, ca)
    heads_a = am.dims[spec_a.index(heads)] if heads else None
    heads_b = bm.dims[spec_b.index(heads)] if heads and heads in spec_b else None
    claim_scores(rows, cols, ca, cb, heads_a, heads_b)
    _claim_operand_roles(am, bm)
    out = product.equation.out
    if rows and cols and out[-1] == row:
        _note_keys_first(call, rows, cols, product, row)
    if rows and cols:
        # The letters say which axis holds the queries and which the keys, also where the
        # two are other positions (slots against an image's) and the queries' axis is a
        # broadcast copy that takes no claim (slot attention's learned slots).
        tags = tuple("q" if x == row else "k" if x == product.cols else None for x in out)
        return Made(dims, tags, role)
    return Made(dims, (), role)


def _claim_shared_values(v_cols: Axis) -> None:
    """Weights with a heads letter the values lack (multi-query): each head reads the same
    values, so their features are the head size, d_k, as the shared keys' are."""
    if len(v_cols) == 1 and D.claim_kind(v_cols[0][0], FEATURE, STRUCTURE):
        D.claim_part(v_cols[0], "d_k", STRUCTURE)


def _query_heads_letter(rows: str, spec: str, dims, contract: Axis) -> str | None:
    """Of a product's two row letters, the heads that only the queries carry (multi-query
    keys `b j d` against queries `b h i d`): the one whose axis is the factor just outside
    the contracted head size in the same dim (the queries' head split). None where
    structure does not single one out: then nothing is claimed."""
    if len(contract) != 1:
        return None
    found = [x for x in rows if _sibling(dims[spec.index(x)], contract[0]) is not None]
    return found[0] if len(found) == 1 else None


def _heads_letter(batch: str, spec: str, dims, contract: Axis) -> str | None:
    """The batch letter of the heads: the one whose axis is the factor just outside the
    contracted head size in the same dim (a head split), else the last batch letter."""
    if len(contract) == 1:
        for letter in batch:
            if _sibling(dims[spec.index(letter)], contract[0]) is not None:
                return letter
    return batch[-1] if batch else None


# Query-key einsums whose output puts the queries last (`... i d, ... j d -> ... j i`), by
# the dims of their queries' and keys' axes: softmax(dim=-1) over such scores runs along the
# queries, and its hint names the product to fix, with its subscripts (a memo for messages
# only, bounded; dims are never reused, so an entry cannot name another product).
_KEYS_FIRST = Memo("keys-first products", 256)


def _note_keys_first(call, rows: Axis, cols: Axis, product, row: str) -> None:
    equation = product.equation
    swap = {row: product.cols, product.cols: row}
    out = "".join(swap.get(x, x) for x in equation.out)
    site = call.site
    pattern = (
        subscripts.einops_pattern(site.args, 2)
        if site is not None and call.site_matches()
        else None
    )
    words = subscripts.words_of(pattern) if pattern is not None else None
    _KEYS_FIRST.put(
        _pair_key(rows, cols),
        (pattern or equation.text, equation.write(equation.specs, out, words)),
    )


def _pair_key(queries: Axis, keys: Axis) -> tuple[int, ...]:
    return (*(r.serial for r in D.roots_of(queries)), 0, *(r.serial for r in D.roots_of(keys)))


def keys_first_einsum(queries: Axis, keys: Axis) -> tuple[str, str] | None:
    """(the user's equation, the same with the queries before the keys) of the query-key
    einsum that put these keys before these queries, when one did."""
    return _KEYS_FIRST.get(_pair_key(queries, keys))
