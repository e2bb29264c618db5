"""How a traced forward applied its masks, as the probes need it.

Every mask an op applies to attention scores is read by `checks.mask_semantics.mask_uses`
as `hidden` (True where a key is hidden from a query), whatever its spelling (a bool
mask for SDPA keeps, `masked_fill` hides, an additive mask is very negative where it
hides). From it the probes keep, per use:

- `unseen`: the keys of each example hidden from every query and head: the padding, as
  the module reads it (a causal or sliding-window mask hides no key from every query,
  since each query sees its own key);
- the scores' key axis (provenance), to tell which sequence the mask pads;
- whether the pattern is causal: each real query's last visible key on the diagonal,
  or next to it (a band: a sliding window, an off-by-one triangle), moving forward with
  the query.

The probes then read an input mask's polarity by comparing its values with `unseen`,
never from its name.
"""

from dataclasses import dataclass

import torch

from ..checks.mask_semantics import aligned


@dataclass(slots=True)
class MaskUse:
    """One mask, as one op applied it."""

    op: str
    target: tuple[int, ...]  # the scores' shape [..., seq_q, seq_k]
    unseen: torch.Tensor  # bool [batch or 1, seq_k]: keys no query of the example sees
    keys: tuple = ()  # provenance of the scores' key axis (atoms), when known
    queries: tuple = ()  # provenance of the scores' query axis
    hidden: torch.Tensor | None = None  # bool, True = hidden, as applied (small ones only)
    extra: bool = True  # it hides more than whole keys (a causal mask, a window, ...)


def beyond_padding(hidden: torch.Tensor, target: tuple[int, ...], unseen) -> bool:
    """Whether a mask hides more than whole keys: some query, but not every one, is
    kept from some key."""
    hidden = aligned(hidden, len(target)).cpu()
    if len(target) >= 3:
        shape = [1] * len(target)
        shape[0], shape[-1] = unseen.shape[0], unseen.shape[-1]
        whole = unseen.view(shape)
    else:
        whole = unseen
    return bool((hidden & ~whole).any())


def unseen_keys(hidden: torch.Tensor, target: tuple[int, ...]) -> torch.Tensor:
    """[batch or 1, seq_k]: True where the key is hidden from every query (and head) of
    the example; a 2-D target has no batch axis, so one row."""
    hidden = aligned(hidden, len(target))
    sk = target[-1]
    if len(target) >= 3:
        inner = tuple(range(1, len(target) - 1))
        unseen = hidden.all(dim=inner) if inner else hidden
    else:
        unseen = hidden.all(dim=0, keepdim=True)
    return unseen.expand(unseen.shape[0], sk).cpu()


def causal_pattern(hidden: torch.Tensor, target: tuple[int, ...]) -> str | None:
    """ "triangle" (each query sees the keys up to its own, the queries the last ones
    when there are more keys), "band" (the last visible key next to the diagonal, or a
    window), or None. Padded keys (unseen by every query) and fully hidden query rows
    are left out, so a padded causal mask is still causal."""
    sq, sk = target[-2:]
    if sq < 2 or sk < 2:
        return None
    hidden = aligned(hidden, len(target))
    if tuple(hidden.shape[-2:]) != (sq, sk):
        return None
    slices = hidden.reshape(-1, sq, sk).cpu()
    if slices.shape[0] > 1 and bool((slices == slices[:1]).all()):
        slices = slices[:1]  # a mask broadcast over batch and heads: one pattern
    offset = sk - sq
    exact, seen = True, False
    for h in slices:
        pad_keys = h.all(0)  # [sk]
        rows = ~h.all(1)  # [sq]: queries that see something
        visible = ~h & ~pad_keys[None, :]
        if not bool(rows.any()):
            continue
        index = torch.arange(sk)
        last = torch.where(visible, index[None, :], -1).amax(1)  # [sq]
        q = torch.arange(sq)[rows]
        last = last[rows]
        real_keys = ~pad_keys
        # Keys that are real and lie after the diagonal: a causal mask hides them all.
        after = (index[None, :] > (q[:, None] + offset)) & real_keys[None, :]
        if not bool(after.any()):
            return None  # nothing after any query to hide: cannot tell
        diag = q + offset
        # The query's own key may itself be padding: compare with the last real key
        # at or before the diagonal. More queries than keys (a Perceiver's latents) put
        # the first queries' diagonals before every key: they own none (-1).
        reals = torch.cummax(torch.where(real_keys, index, -1), 0).values
        own = torch.where(diag >= 0, reals[diag.clamp(0, sk - 1)], -1)
        if bool(((last - own).abs() > 1).any()) or bool((last[1:] < last[:-1]).any()):
            return None
        seen = True
        hides_after = bool((h[rows] | ~after).all())
        exact = exact and hides_after and bool((last == own).all())
    if not seen:
        return None
    return "triangle" if exact else "band"


def after_softmax(call):
    """(op, hidden, target) for a mask applied to attention weights instead of scores:
    `attn.masked_fill(mask == 0, 0)` or `attn * mask`. The weights it zeroes are hidden,
    but the softmax saw them: the probes read its polarity, the rule for it is theirs."""
    args = call.args
    if (
        len(args) < 2
        or not isinstance(args[0], torch.Tensor)
        or not isinstance(args[1], torch.Tensor)
    ):
        return None
    from .. import _ops

    op = call.spec.name
    x, mask = args[0], args[1]
    if call.spec is _ops.by_name("masked_fill") and len(args) >= 3:
        meta = call.meta(x)
        fill = args[2]
        if meta is None or meta.role != "attn" or mask.dtype != torch.bool:
            return None
        if not isinstance(fill, int | float) or fill != 0:
            return None
        hidden = mask
    elif call.spec is _ops.by_name("mul"):
        metas = [call.meta(x), call.meta(mask)]
        if metas[0] is None or metas[0].role != "attn":
            x, mask = mask, x
            metas.reverse()
        if metas[0] is None or metas[0].role != "attn" or mask.dim() < 2:
            return None
        if mask.numel() > 1 << 22 or not bool(((mask == 0) | (mask == 1)).all()):
            return None
        hidden = mask == 0
    else:
        return None
    target = tuple(x.shape)
    if hidden.dim() > len(target) or len(target) < 2:
        return None
    try:
        torch.broadcast_shapes(tuple(hidden.shape), target)
    except RuntimeError:
        return None
    return f"{op} after softmax", hidden, target


def kept(hidden: torch.Tensor, uses: list) -> torch.Tensor | None:
    """`hidden` to keep with a use: small ones, once (every layer applies the same mask)."""
    if hidden.numel() > 1 << 20:
        return None
    for use in reversed(uses[-4:]):
        other = use.hidden
        if other is not None and other.shape == hidden.shape and bool((other == hidden).all()):
            return other
    return hidden.detach().cpu()


def matches(t_marked: torch.Tensor, use: MaskUse) -> bool:
    """Whether an input's marked values are what `use` hid, or their inverse (an input
    mask applied as it is, or through `mask == 0`)."""
    hidden = use.hidden
    if hidden is None or t_marked.dim() > hidden.dim() or t_marked.dim() < 2:
        return False
    lead = hidden.dim() - t_marked.dim()
    if any(
        a != b and a != 1 and b != 1
        for a, b in zip(t_marked.shape, hidden.shape[lead:], strict=True)
    ):
        return False
    try:
        same = torch.broadcast_tensors(t_marked.cpu(), hidden)
    except RuntimeError:
        return False
    return bool((same[0] == same[1]).all()) or bool((same[0] != same[1]).all())


def key_axis(call, use_op: str) -> tuple[tuple, tuple]:
    """(key axis, query axis) provenance of the scores an op masks, as atoms."""
    import torch as _torch

    def dims(t, k):
        if not isinstance(t, _torch.Tensor) or not -t.dim() <= k < t.dim():
            return ()
        meta = call.meta(t)
        if meta is None and t._base is not None:
            # A view made where the session does not look (inside a composite torch
            # module it suspends for): the base's axis with the same stride and size.
            base, k = t._base, k % t.dim()
            meta = call.meta(base)
            hits = [
                d
                for d in range(base.dim())
                if base.stride(d) == t.stride(k) and base.shape[d] == t.shape[k]
            ]
            if meta is None or len(hits) != 1 or len(meta.dims) != base.dim():
                return ()
            return meta.dims[hits[0]]
        if meta is None or len(meta.dims) != t.dim():
            return ()
        return meta.dims[k]

    op = call.op
    args = call.args
    if call.spec.name == "masked_fill":
        return dims(args[0], -1), dims(args[0], -2)
    if op == "where" and len(args) >= 3:
        scores = next((a for a in args[1:3] if isinstance(a, _torch.Tensor) and a.dim() >= 2), None)
        return dims(scores, -1), dims(scores, -2)
    if op == "scaled_dot_product_attention":
        bound = call.bound()
        return dims(bound.get("key"), -2), dims(bound.get("query"), -2)
    if op == "multi_head_attention_forward":
        bound = call.bound()
        return dims(bound.get("key"), 0), dims(bound.get("query"), 0)
    if len(args) >= 2:  # an additive mask: the scores are the operand of the full shape
        tensors = [a for a in args[:2] if isinstance(a, _torch.Tensor)]
        if tensors:
            scores = max(tensors, key=lambda t: t.numel())
            return dims(scores, -1), dims(scores, -2)
    return (), ()
