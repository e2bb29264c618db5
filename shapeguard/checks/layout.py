"""Layouts that run and compute the wrong thing: attention over the wrong axis.

- Attention (SDPA, or a hand-written query-key product) whose sequence axis holds a
  factor of the features: `[batch, seq, heads, d_k]` where `[batch, heads, seq, d_k]`
  was meant, so each token attends across its own heads.
- `nn.MultiheadAttention(batch_first=False)` given `[batch, seq, embed]`: it reads the
  batch as the sequence and attends across examples.
- rotary cos/sin whose position axis lines up with the heads (or a feature) axis.
- a gather along the features with an index copied along them (MAE's random masking
  with `dim=2` for `dim=1`): each output row is one element repeated; or along one axis
  with indices that an argsort made positions along another (`argsort(noise, dim=0)`).

What an axis is comes from its provenance (`_names`): a factor of a projection's
output features is a feature however many entries it has, so the rules hold when
seq == heads == d_k. Softmax over the query axis is the softmax family's.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names import subscripts
from .._names.dims import BATCH, COPY, FEATURE, TOKEN
from .._values import is_tensor
from . import WARNING, _rotary_values, rule
from ._einsum import written
from ._mask_effects import readable
from ._view import CallView

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass


def heads_on_seq(call, t) -> bool:
    """`t` is `[..., seq, heads, d_k]`: the axis attention runs along (-2) is a factor of
    the features (a projection's, by its parameters), the one before it the tokens."""
    if t.dim() < 3 or t.shape[-2] < 2:
        return False
    return call.kind(t, -2, strong=True) == FEATURE and call.kind(t, -3) == TOKEN


def _head_split(heads, d_k) -> bool:
    """`heads` and `d_k` are the outer and inner factor of one dim (a head split of one
    projection's features), as in q [.., heads, d_k]; attention weights are not."""
    if len(heads) != 1 or len(d_k) != 1:
        return False
    (h, h_stride, _), (d, d_stride, d_size) = heads[0], d_k[0]
    return h.find() is d.find() and h_stride == d_stride * d_size


def _bshd(call, t) -> str:
    axes = call.axes(t)
    return ", ".join(n or str(int(s)) for n, s in zip(axes, t.shape, strict=True))


# -- SDPA ----------------------------------------------------------------------------
@rule(_ops.SDPA, kinds={"layout_bshd": WARNING}, order=1)
def sdpa_layout(call: CallView) -> Iterator[Violation]:
    p = call.bound()
    tensors = [p.get(n) for n in ("query", "key", "value")]
    q, k, v = tensors
    if not (is_tensor(q) and is_tensor(k) and is_tensor(v)):
        return
    if not (q.dim() == 4 and k.dim() == 4 and v.dim() == 4):
        return
    if not (q.shape[0] == k.shape[0] == v.shape[0] and k.shape[:-1] == v.shape[:-1]):
        return  # a loud mismatch: the sdpa family reports it
    if not (heads_on_seq(call, q) and heads_on_seq(call, k)):
        return
    labels = [call.label(i, n) for i, n in enumerate(("q", "k", "v"))]
    lq = labels[0]
    yield Violation(
        "layout_bshd",
        f"scaled_dot_product_attention: {lq} is [{_bshd(call, q)}]: SDPA reads "
        f"axis 1 as heads and axis 2 as the sequence, so it attends across the "
        f"{q.shape[2]} heads of each token instead of across the {q.shape[1]} tokens",
        tuple(call.operand(label, t) for label, t in zip(labels, tensors, strict=True)),
        f"SDPA wants [batch, heads, seq, d_k]: pass {lq}.transpose(1, 2) (and the same for "
        f"{labels[1]} and {labels[2]}), then transpose the output back with .transpose(1, 2)",
        severity="warning",
    )


# -- a hand-written query-key product ------------------------------------------------
@rule(
    _ops.by_name("matmul"),
    _ops.by_name("einsum"),
    kinds={"layout_bshd": WARNING},
    order=1,
)
def product_layout(call: CallView) -> Iterator[Violation]:
    """`q @ k.transpose(-2, -1)` on `[batch, seq, heads, d_k]`: the scores pair the heads
    of each token, not the tokens. What the product pairs is read from the einsum's letters
    where there are letters (`bihd,bjhd->bhij` keeps the heads apart and pairs the tokens:
    right), from the last two axes of a matmul otherwise."""
    pairing = _qk_pairing(call)
    if pairing is None:
        return
    q, k = pairing.q, pairing.k
    # The queries' attended axis is a factor of a projection's features (by its parameters),
    # the outer one of a head split whose inner one is contracted: heads, not positions.
    if call.kind(q, pairing.q_rows, strong=True) != FEATURE:
        return
    if not _head_split(call.dims(q)[pairing.q_rows], call.dims(q)[pairing.q_features]):
        return
    tokens = next((i for i in pairing.q_kept if call.kind(q, i) == TOKEN), None)
    if tokens is None:
        return
    # k is laid out the same way: its rows (the keys) are features as well.
    if call.kind(k, pairing.k_features, strong=True) != FEATURE:
        return
    if call.kind(k, pairing.k_rows) != FEATURE:
        return
    out = call.output_labels(1)
    prefix = f"{out[0]} = " if out and out[0] else ""
    user = written(call, [q, k]) if pairing.product is not None else None
    if user is not None:
        lq, lk = user.labels
        what = f"einsum '{user.equation}'"
    else:
        lq, lk = call.label(0, "q"), call.label(1, "k")
        if call.op in call.spec.reflected:
            lq, lk = lk, lq
        what = f"{lq} @ {lk}"
    split = (
        "split the heads with view(batch, seq, heads, d_k).transpose(1, 2), which makes "
        "[batch, heads, seq, d_k], for q, k and v alike, and transpose the context back with "
        ".transpose(1, 2) before merging the heads"
    )
    fixed = _fixed_einsum(pairing, tokens, user)
    yield Violation(
        "layout_bshd",
        f"{prefix}{what}: {lq} is [{_bshd(call, q)}]: the product pairs the "
        f"{q.shape[pairing.q_rows]} heads of each token with each other instead of the "
        f"{q.shape[tokens]} tokens, so softmax then mixes heads, not positions",
        (call.operand(lq, q), call.operand(lk, k)),
        f"give each axis of {lq} and {lk} the letter of what it holds (the tokens are axis "
        f"{tokens}): '{fixed}', and v's likewise where the weights meet it; or {split}"
        if fixed
        else split,
        severity="warning",
    )


class _Pairing(NamedTuple):
    """What a two-operand product pairs: for each side, the axis its rows run along and its
    contracted (feature) axis; for the queries, the axes the product keeps apart."""

    q: Any
    k: Any
    q_rows: int
    q_features: int
    k_rows: int
    k_features: int
    q_kept: tuple[int, ...]
    product: Any = None  # an einsum's letters (`subscripts.Product`)


def _qk_pairing(call) -> _Pairing | None:
    """The pairing of a query-key-like product, or None: an einsum's by its letters (one
    contracted letter, one row letter on each side), a matmul's by its last two axes."""
    args = call.args
    if call.op == "einsum":
        operands = list(args[1:]) if len(args) > 2 else list(args[1]) if len(args) == 2 else []
        if len(operands) != 2 or not all(is_tensor(t) for t in operands):
            return None
        a, b = operands
        product = subscripts.product(args[0], (a.dim(), b.dim()))
        if product is None or a.dim() < 3:
            return None
        if not len(product.contracted) == len(product.rows) == len(product.cols) == 1:
            return None
        spec_a, spec_b = product.equation.specs
        return _Pairing(
            a,
            b,
            q_rows=spec_a.index(product.rows),
            q_features=spec_a.index(product.contracted),
            k_rows=spec_b.index(product.cols),
            k_features=spec_b.index(product.contracted),
            q_kept=tuple(spec_a.index(x) for x in product.batch),
            product=product,
        )
    if len(args) < 2 or not (is_tensor(args[0]) and is_tensor(args[1])):
        return None
    a, b = args[0], args[1]
    if call.op in call.spec.reflected:
        a, b = b, a
    if a.dim() < 3 or b.dim() < 3 or a.shape[-1] != b.shape[-2]:
        return None
    # q @ k^T: k^T's contracted axis is -2, its keys -1; the axes before q's last two are
    # kept apart (broadcast batch axes).
    lead = tuple(range(a.dim() - 2))
    return _Pairing(a, b, a.dim() - 2, a.dim() - 1, b.dim() - 1, b.dim() - 2, lead)


def _fixed_einsum(pairing: _Pairing, tokens: int, user) -> str | None:
    """The equation with the queries' row letter and their token letter swapped, on both
    sides, when k has the token letter where q does: the same product of `[batch, seq, heads,
    d_k]` tensors, pairing the tokens."""
    product = pairing.product
    if product is None:
        return None
    spec_a, spec_b = product.equation.specs
    token_letter = spec_a[tokens]
    row, col = product.rows, product.cols
    if not subscripts.is_letter(token_letter) or spec_b.find(token_letter) != tokens:
        return None  # under `...` (no letter to move), or k's tokens elsewhere
    swap_a = {row: token_letter, token_letter: row}
    swap_b = {col: token_letter, token_letter: col}
    fixed_a = "".join(swap_a.get(x, x) for x in spec_a)
    fixed_b = "".join(swap_b.get(x, x) for x in spec_b)
    return user.write(product.equation, (fixed_a, fixed_b), product.equation.out)


# -- nn.MultiheadAttention -------------------------------------------------------------
@rule(_ops.MHA, kinds={"mha_batch_first": WARNING}, order=1)
def mha_batch_first(call: CallView) -> Iterator[Violation]:
    module = call.module
    if module is None or getattr(module, "batch_first", True):
        return
    root = call.root
    # A torch module at the root defines its own layout through batch_first: the trace
    # then has no independent word on which axis is the batch.
    if root is None or type(root).__module__.startswith("torch.nn"):
        return
    query = call.args[0] if call.args else call.kwargs.get("query")
    if not is_tensor(query) or query.dim() != 3:
        return
    # Read as [seq, batch, embed], the batch axis would be attended along. The input's
    # usual layout ([batch, seq, ...]) alone is no witness: a seq-first model hands its
    # [seq, batch, embed] input to batch_first=False exactly as the bug hands [batch, seq,
    # embed], and the two compute the same thing. Only structure tells them apart: the
    # positions found on axis 1 (a position embedding of arange, a rotary table, an
    # attention or a conv that ran along it) or a contract that says so.
    if call.kind(query, 0) != BATCH or call.kind(query, 1) != TOKEN:
        return
    first, second = call.kind(query, 0, strong=True), call.kind(query, 1, strong=True)
    if first == TOKEN or second == BATCH or (first != BATCH and second != TOKEN):
        return
    axes = call.axes(query)
    label = call.label(0, "query")
    b, s, e = (int(n) for n in query.shape)
    yield Violation(
        "mha_batch_first",
        f"MultiheadAttention(batch_first=False) got {label} [batch={b}, {axes[1] or 'seq'}={s}, "
        f"embed_dim={e}]: it reads [seq, batch, embed_dim], so it attends across the {b} "
        f"examples of the batch, once per token",
        (call.operand(label, query),),
        "build nn.MultiheadAttention(..., batch_first=True), or pass "
        f"{label}.transpose(0, 1) (and the same for key and value) and transpose the output back",
        severity="warning",
    )


# -- rotary embeddings ---------------------------------------------------------------
@rule(_ops.by_name("mul"), kinds={"rotary_axis": WARNING}, order=1, operands=2)
def rotary_axis(call: CallView) -> Iterator[Violation]:
    """A rotary table (made by cos, sin or polar, or complex: a rotation; or whose values
    rotate by one step per row) multiplied into q or k: each of its axes but the last (the
    frequencies) must line up with the batch or the positions, never with a factor of the
    features."""
    args = call.args
    if len(args) < 2 or not is_tensor(args[0]) or not is_tensor(args[1]):
        return
    for x, c, index in ((args[0], args[1], 1), (args[1], args[0], 0)):
        if c.dim() < 2 or x.dim() < c.dim() or x.dim() < 3:
            continue  # cheap tests first: this runs on every multiplication
        c_meta, x_meta = call.meta(c), call.meta(x)
        if x_meta is not None and x_meta.rotary:
            continue
        if call.kind(x, -1, strong=True) != FEATURE:
            continue
        made = c.is_complex() or (c_meta is not None and c_meta.rotary)
        lead = x.dim() - c.dim()
        for i in range(c.dim() - 1):
            if c.shape[i] == 1 or call.kind(x, lead + i, strong=True) != FEATURE:
                continue
            # A table made in the trace (cos, sin, polar) or complex meets the heads with a
            # position axis of its own; one that took the heads' identity (cut by a size
            # read from them, `cache[:q.size(1)]`) or was built before the trace says what
            # its axis holds by its values: positions 0, 1, 2, ... (`_rotary_values`).
            per_head = call.kind(c, i, strong=True) == FEATURE
            if (per_head or not made) and not _rotary_values.positions_axis(c, i):
                continue  # a per-head table lined up with the heads, or no rotation
            c_label = call.label(index, "cos")
            x_label = call.label_of(x, "q")
            x_axes = call.axes(x)
            at = lead + i
            name = f".{x_axes[at]}" if x_axes[at] else f" axis {at - x.dim()}"
            yield Violation(
                "rotary_axis",
                f"{x_label} * {c_label}: the positions of {c_label} (axis {i - c.dim()}, size "
                f"{c.shape[i]}) line up with {x_label}{name} ({x.shape[at]}), not with its "
                "sequence axis: each head gets one position's rotation",
                (call.operand(x_label, x), call.operand(c_label, c)),
                _rotary_hint(call, x, at, x_label, c_label),
                severity="warning",
            )
            return


def _rotary_hint(call, x, heads: int, x_label: str, c_label: str) -> str:
    """Where the sequence axis comes after the heads, the rotary was applied to [batch,
    heads, seq, d_k] by code written for [batch, seq, heads, d_k] (its table cut by
    `x.size(1)`): applying it before the transpose is the fix, or a table for this layout."""
    layout = ", ".join(n or "?" for n in call.axes(x))
    seq = next((j for j in range(x.dim() - 1) if call.kind(x, j) == TOKEN), None)
    if seq is not None and seq > heads:
        return (
            "apply the rotary before the heads transpose, on [batch, seq, heads, d_k]; or put "
            f"the positions of {c_label} on axis {seq} of [{layout}], the sequence: "
            f"{x_label}.size({seq}) rows (not .size({heads})) shaped [..., seq, d_k] for "
            "[batch, heads, seq, d_k] (unsqueeze_dim=1)"
        )
    return (
        f"put the position axis of {c_label} on the sequence axis of [{layout}]: "
        f"{c_label} shaped [..., seq, 1, d_k] for [batch, seq, heads, d_k] (unsqueeze_dim=2), "
        "[..., seq, d_k] for [batch, heads, seq, d_k] (unsqueeze_dim=1)"
    )


# -- gather ------------------------------------------------------------------------------
@rule(_ops.by_name("gather"), kinds={"gather_axis": WARNING}, order=1)
def gather_axis(call: CallView) -> Iterator[Violation]:
    """`torch.gather(x, d, index)` with `index` a broadcast copy along `d` (made by repeat or
    expand, and the same value at every place of that axis, as its values show: only small
    CPU indices are read) and `x`'s axis `d` features: every
    output element along `d` is the same element of `x`. The index was copied along the
    features to gather along another axis (the tokens its values address: an argsort or
    top-k over them), and `d` names the features instead. Else, an index whose values an
    argsort made positions along another of its axes (`_addressed_elsewhere`)."""
    if getattr(call.func, "__name__", "") == "take_along_dim":
        return  # (input, indices, dim): broadcasts, and its parameters are in another order
    p = call.bound()
    x, index = p.get("input"), p.get("index")
    if not (is_tensor(x) and is_tensor(index)) or index.dim() != x.dim() or x.dim() < 2:
        return
    d = p.get("dim")
    if not isinstance(d, int) or not -x.dim() <= d < x.dim():
        return
    d %= x.dim()
    if not _copied_along(call, x, index, d):
        other_axis = _addressed_elsewhere(call, x, index, d)
        if other_axis is not None:
            yield other_axis
        return
    x_label, i_label = call.label_of(x, "x"), call.label_of(index, "index")
    out = call.output_labels(1)
    prefix = f"{out[0]} = " if out and out[0] else ""
    name = call.axes(x)[d] or "features"
    # The axis the values likely address: a token axis of x the index is not a copy along,
    # else the last such axis (named in the hint only).
    kept = [j for j in range(x.dim()) if j != d and call.kind(index, j) != COPY]
    keep = next((j for j in kept if call.kind(x, j) == TOKEN), kept[-1] if kept else None)
    other = f"dim={keep}" if keep is not None else "the axis its values address"
    yield Violation(
        "gather_axis",
        f"{prefix}torch.gather({x_label}, dim={d}, {i_label}): {i_label} is a copy along axis "
        f"{d} (repeat or expand: one value for all {index.shape[d]} places), and axis {d} of "
        f"{x_label} is its {name} ({x.shape[d]}): each output row is one element of "
        f"{x_label} repeated, not a gather of rows",
        (call.operand(x_label, x), call.operand(i_label, index)),
        f"gather along the axis the index's values address ({other}, the tokens for ids from "
        "an argsort or top-k over them), with the index copied along the features: "
        f"torch.gather({x_label}, dim={keep if keep is not None else 1}, index=ids.unsqueeze(-1)"
        f".expand(-1, -1, {x.shape[d]}))",
        severity="warning",
    )


def _copied_along(call, x, index, d: int) -> bool:
    """`index` is a broadcast copy along `d`, and axis `d` of `x` its features."""
    if index.shape[d] < 2 or call.kind(index, d, strong=True) != COPY:
        return False
    if call.kind(x, d, strong=True) != FEATURE:
        return False
    # A copy's kind also survives arithmetic with a real axis (relative positions made as
    # `pos.repeat(1, T, 1) - pos[..., None]`), so the values must say it: one per row.
    return readable(index) and bool((index == index.narrow(d, 0, 1)).all())


def _addressed_elsewhere(call, x, index, d: int) -> Violation | None:
    """`index`'s values are positions along its own axis k (an argsort's or a sort's
    explicit `dim=k`, `_names/flow/addresses.py`), k != d: gather lines up axis k of the
    index with axis k of `x` and reads the values as positions along `d`. Only where
    structure makes axes k and d of `x` different kinds (its batch and its tokens): a
    distance matrix's rows and columns are the same points, ranked down one and read along
    the other; nor where the two are one axis."""
    k = call.meta_of(index).addresses
    if k < 0 or k == d or k >= index.dim() or index.shape[k] < 2:
        return None
    kinds = call.kind(x, k, strong=True), call.kind(x, d, strong=True)
    if None in kinds or COPY in kinds or kinds[0] == kinds[1]:
        return None
    along_k = {*D.roots_of(call.dims(index)[k]), *D.roots_of(call.dims(x)[k])}
    along_d = {*D.roots_of(call.dims(index)[d]), *D.roots_of(call.dims(x)[d])}
    if along_k & along_d:
        return None
    x_label, i_label = call.label_of(x, "x"), call.label_of(index, "index")
    out = call.output_labels(1)
    prefix = f"{out[0]} = " if out and out[0] else ""
    ranked = call.axes(index)[k] or call.axes(x)[k]
    ranked = f"its {ranked} ({index.shape[k]})" if ranked else f"{index.shape[k]} entries"
    read = call.axes(x)[d]
    read = f"{read} ({x.shape[d]})" if read else f"axis {d} ({x.shape[d]})"
    return Violation(
        "gather_axis",
        f"{prefix}torch.gather({x_label}, dim={d}, {i_label}): the values of {i_label} are "
        f"positions along its axis {k}, {ranked} (an argsort or sort along dim={k} made them), "
        f"but gather reads them along {x_label}'s {read} and lines up axis {k} of {i_label} "
        f"with axis {k} of {x_label}: each row picks by its rank along axis {k}, not by its own "
        "order",
        (call.operand(x_label, x), call.operand(i_label, index)),
        f"sort along the axis the gather reads: argsort (or sort) with dim={d}, so that the "
        f"values are positions along axis {d} of {x_label}, not dim={k}",
        severity="warning",
    )
