"""A mask tiled over [batch * heads] in the wrong order: nn.MultiheadAttention's 3-D
attn_mask, and a mask applied to scores whose heads are folded into the batch.

MultiheadAttention reads a `[batch * heads, seq_q, seq_k]` mask as `[batch, heads]`:
the copies of one example's mask must be adjacent (`repeat_interleave(heads, 0)`,
einops `(b h)`). `mask.repeat(heads, 1, 1)` tiles the whole batch once per head
(`(h b)`), so head k of example i gets the mask of another example. The mask's
provenance says which factor of its first axis is the broadcast copy and which the
batch, whatever the sizes.
"""

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names import intent
from .._names.dims import BATCH, COPY, FEATURE
from .._values import is_tensor
from . import WARNING, rule
from ._view import CallView
from .mha import bind_arguments

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    pass


@rule(_ops.MHA, kinds={"batch_mixing": WARNING}, order=1)
def mask_tiling(call: CallView) -> Iterator[Violation]:
    p = bind_arguments(call)
    mask, query, heads = p.get("attn_mask"), p.get("query"), p.get("num_heads")
    if not (is_tensor(mask) and is_tensor(query) and isinstance(heads, int)):
        return
    if mask.dim() != 3 or query.dim() != 3:
        return
    batch = int(query.shape[1])  # the functional form is [seq, batch, embed]
    if int(mask.shape[0]) != batch * heads or batch < 2 or heads < 2:
        return
    atoms = D.normalize(call.dims(mask)[0])
    if len(atoms) != 2:
        return
    outer, inner = atoms
    outer_kind, inner_kind = D.kind_of((outer,)), D.kind_of((inner,))
    if outer_kind != COPY or outer[2] != heads or inner[2] != batch or inner_kind == COPY:
        return
    if batch == heads and inner_kind != BATCH:
        return  # a per-head mask tiled over the batch looks the same: only the batch tells
    site = call.site
    label = dict(site.keywords).get("attn_mask", "attn_mask") if site is not None else "attn_mask"
    base = label if label.isidentifier() else "mask"
    yield Violation(
        "batch_mixing",
        f"MultiheadAttention: {label} [{batch * heads}, {mask.shape[1]}, {mask.shape[2]}] is "
        f"tiled heads first ([heads={heads}, batch={batch}], as repeat makes it), but "
        f"nn.MultiheadAttention reads its first axis as [batch, heads]: most heads of each "
        "example get another example's mask",
        (call.operand(label, mask),),
        f"put the {heads} copies of each example's mask next to each other: "
        f"{base}.repeat_interleave({heads}, dim=0) (einops: '(b h) i j', batch first), not "
        f"{base}.repeat({heads}, 1, 1)",
        severity="warning",
    )


# -- a mask tiled against scores with the heads folded into the batch ----------------------
@rule(
    _ops.by_name("masked_fill"),
    _ops.by_name("where"),
    _ops.by_name("add"),
    kinds={"batch_mixing": WARNING},
    order=1,
)
def mask_tiling_order(call: CallView) -> Iterator[Violation]:
    """A tensor folded `[batch * heads]` (`(b h)`: its heads a factor of a projection's
    features, by structure) masked or biased by one tiled over that axis with copies
    counted as the heads (`self.n_heads`) or read from the fold's other factor: the copies
    must sit where the fold has what they count. Copies of the heads where the batch is
    (`repeat(mask, "b j -> (h b) () j")` against `(b h)`) hand most heads of each example
    another example's mask."""
    pair = _masked_pair(call)
    if pair is None:
        return
    (x_label, x), (m_label, mask) = pair
    lead = x.dim() - mask.dim()
    if lead < 0:
        return
    for i in range(mask.dim()):
        found = _tiled_against(call, x, lead + i, mask, i) if mask.shape[i] > 1 else None
        if found is None:
            continue
        fold, tiles, stands = found
        order = " * ".join(f"{n}={s}" for n, s in fold)
        tiled = " * ".join(f"{n}={s}" for n, s in tiles)
        other = next(n for n, _ in fold if n != "heads") if stands == "heads" else "heads"
        harm = (
            "most heads of each example get another example's rows"
            if stands == "heads"
            else "most examples get another head's rows"
        )
        yield Violation(
            "batch_mixing",
            f"{call.op}: axis {i} of {m_label} is tiled [{tiled}] ({mask.shape[i]}), but axis "
            f"{lead + i} of {x_label} is [{order}]: the {stands} copies sit where {x_label} "
            f"has the {other}, so {harm}",
            (call.operand(x_label, x), call.operand(m_label, mask)),
            _order_hint(call, m_label, fold),
            severity="warning",
        )
        return


def _masked_pair(call) -> tuple | None:
    """((label, tensor masked), (label, mask)) of masked_fill, where or +."""
    args = call.args
    if call.op == "masked_fill":
        if len(args) >= 2 and is_tensor(args[0]) and is_tensor(args[1]):
            return (call.label(0, "input"), args[0]), (call.label(1, "mask"), args[1])
        return None
    if call.op == "where":
        p = _ops.bind(call.spec, args, call.kwargs, call.is_method)
        cond, value = p.get("condition"), p.get("input")
        if is_tensor(cond) and is_tensor(value):
            return (call.label_of(value, "input"), value), (call.label_of(cond, "mask"), cond)
        return None
    if len(args) >= 2 and is_tensor(args[0]) and is_tensor(args[1]):
        a, b = (args[0], args[1]) if args[0].dim() >= args[1].dim() else (args[1], args[0])
        return (call.label_of(a, "input"), a), (call.label_of(b, "mask"), b)
    return None


def _tiled_against(call, x, j: int, mask, i: int):
    """For axis j of `x` folded with the heads (a factor of features, by structure) and axis
    i of `mask` [copies, real] whose copies count the heads or the fold's other factor: (the
    fold's names and sizes, the mask's, what the copies stand for) when the copies sit at
    the other factor's place; else None."""
    fold, tiles = D.normalize(call.dims(x)[j]), D.normalize(call.dims(mask)[i])
    if len(fold) != 2 or len(tiles) != 2:
        return None
    kinds = [D.established_kind(a) for a in fold]
    copies = [k for k, a in enumerate(tiles) if a[0].find().kind == COPY]
    if kinds.count(FEATURE) != 1 or COPY in kinds or len(copies) != 1:
        return None
    at, heads = copies[0], kinds.index(FEATURE)
    stands = _copies_count(tiles[at], fold[1 - heads])
    if stands is None:
        return None
    want = heads if stands == "heads" else 1 - heads
    if at == want or tiles[at][2] != fold[want][2]:
        return None
    other = fold[1 - heads]
    other_name = D.atom_name(other) or ("batch" if D.kind_of((other,)) == BATCH else "rows")
    names = ["heads" if k == heads else other_name for k in range(2)]
    real = D.atom_name(tiles[1 - at]) or "rows"
    mask_names = [f"{stands} copies" if k == at else real for k in range(2)]
    return (
        list(zip(names, (a[2] for a in fold), strict=True)),
        list(zip(mask_names, (a[2] for a in tiles), strict=True)),
        stands,
    )


def _copies_count(copy, other) -> str | None:
    """What a broadcast copy's count is: "heads" where the module declares it so (the
    copies were counted by `self.n_heads`), "batch" where it was read from the fold's other
    factor (`B, S, _ = x.shape`, then `repeat(B, 1, 1)`)."""
    root = copy[0].find()
    if root.name == "heads" and root.rank >= D.DECLARED:
        return "heads"
    source = D.stands_for(copy)
    if source[0] is not root and source[0].find() is other[0].find():
        return "batch"
    return None


def _order_hint(call, m_label: str, fold) -> str:
    """Tile in the fold's order: the user's einops pattern with its group turned round
    (where one assigned to the mask's name has it the other way), else the two spellings."""
    order = " ".join(n[0] for n, _ in fold)
    base = m_label.strip("~() ")
    heads = next(s for n, s in fold if n == "heads")
    torch_way = (
        f"{base}.repeat_interleave({heads}, dim=0)"
        if fold[0][0] == "batch"
        else f"{base}.repeat({heads}, 1, 1)"
    )
    site = call.site
    for pattern in reversed(intent.einops_patterns(site, base) if site is not None else []):
        fixed = _reordered(pattern, order)
        if fixed is not None:
            return (
                f'tile {base} in the fold\'s order, ({order}): "{fixed}", not "{pattern}" '
                f"(or {torch_way})"
            )
    return (
        f"tile {base} in the fold's order, [{' * '.join(n for n, _ in fold)}]: einops "
        f"'({order})' in the repeat's output, or {torch_way}"
    )


def _reordered(pattern: str, order: str) -> str | None:
    """`pattern` with its right side's two-letter group of a new letter and an old one put
    the other way round, where it is not in `order` (letters b and h) already."""
    left, _, right = pattern.partition("->")
    old = set(left.replace("(", " ").replace(")", " ").split())
    for group in re.findall(r"\(\s*(\w+)\s+(\w+)\s*\)", right):
        if (group[0] in old) == (group[1] in old):
            continue
        batch_first = group[0] in old
        if batch_first == order.startswith("b"):
            continue
        swapped = right.replace(f"({group[0]} {group[1]})", f"({group[1]} {group[0]})", 1)
        return f"{left}->{swapped}" if swapped != right else None
    return None
