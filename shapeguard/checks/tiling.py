"""nn.MultiheadAttention's 3-D attn_mask, tiled over [batch * heads] in the wrong order.

MultiheadAttention reads a `[batch * heads, seq_q, seq_k]` mask as `[batch, heads]`:
the copies of one example's mask must be adjacent (`repeat_interleave(heads, 0)`,
einops `(b h)`). `mask.repeat(heads, 1, 1)` tiles the whole batch once per head
(`(h b)`), so head k of example i gets the mask of another example. The mask's
provenance says which factor of its first axis is the broadcast copy and which the
batch, whatever the sizes.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _ops
from .._errors import Violation
from .._names import dims as D
from .._names.dims import BATCH, COPY
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
