"""Caches of past keys and values, as a decode step uses them.

A cached decode step concatenates the keys (and values) kept from earlier steps with
the new ones, and masks the new queries against all of them. Two bugs there are
common and often silent at one-token steps:

- `cache_axis`: the cache grows along an axis that is not the sequence (the heads,
  the batch, d_k): `torch.cat([past_k, k], dim=1)` on `[batch, heads, seq, d_k]`;
- `mask_cache_length`: the mask's key axis is not cached + new: a square causal mask
  over the new tokens (`[T, T]` against `[T, cached + T]` keys, which broadcasts when
  T == 1 and hides nothing of the cache), or a padding mask not extended by the new
  tokens.

"Cached" comes from provenance: one part of the concatenation was made outside this
forward (a cache object's tensor, a module buffer), and the scores' keys are such a
concatenation. SDPA's `is_causal=True` on a step with cached keys is
`mask_semantics.causal_alignment`.
"""

from collections.abc import Iterator

from .. import _ops, _source
from .._errors import Violation
from .._names import dims as D
from .._values import is_tensor
from . import ERROR, WARNING, rule
from ._view import CallView

_HIDING = -1e4
_CONCATENATION = "a concatenation"


def _outside(call, t) -> bool:
    """Made outside this forward and not a parameter: a cache's tensor, a module buffer,
    or a tensor handed in (a cache dict's); not made by an op of this forward."""
    import torch

    if isinstance(t, torch.nn.Parameter):
        return False
    meta = call.meta(t)
    return meta is None or (not meta.op and not meta.param)


@rule(_ops.by_name("cat"), kinds={"cache_axis": ERROR}, order=0)
def cache_grown_along(call: CallView) -> Iterator[Violation]:
    """A cache of keys or values concatenated with the new ones along an axis that is not
    the sequence."""
    bound = call.bound()
    tensors = bound.get("tensors")
    dim = bound.get("dim", 0)
    if not isinstance(tensors, list | tuple) or len(tensors) != 2 or not isinstance(dim, int):
        return
    if not all(is_tensor(t) for t in tensors):
        return
    past, new = tensors
    if not (_outside(call, past) and not _outside(call, new)):
        return
    # Keys and values are [batch, heads, seq, d_k] (or [batch, seq, heads, d_k]): a 3-D
    # concatenation of features ([x, proj(x)]) is a dense connection, not a cache.
    if past.dim() != new.dim() or new.dim() < 4 or past.numel() == 0:
        return
    d = dim % new.dim()
    axes = call.dims(new)
    # What the cache grows along is known from a parameter or structure (heads and d_k are
    # factors of a projection's features), never from an input's usual layout.
    kind = D.strong_kind_of(axes[d])
    if kind not in (D.FEATURE, D.BATCH):
        return
    # The sequence axis, for the message and the fix: by structure first (positions a
    # rotary table or an attention ran along), else by the input's usual layout or as the
    # one axis of no kind, which the hint then does not turn into a `dim=` (a seq-first
    # cache would get the batch's).
    tokens = [e for e, axis in enumerate(axes) if e != d and D.strong_kind_of(axis) == D.TOKEN]
    certain = bool(tokens)
    if not tokens:
        tokens = [e for e, axis in enumerate(axes) if e != d and D.kind_of(axis) == D.TOKEN]
    if not tokens:
        # A one-token step's sequence axis has size 1 and carries nothing: the axis the
        # cache is longer on, or the one axis of no kind.
        longer = [e for e in range(new.dim()) if e != d and past.shape[e] != new.shape[e]]
        unknown = [e for e, axis in enumerate(axes) if e != d and D.kind_of(axis) is None]
        # The one axis the cache is longer on is where it grew before: the sequence.
        certain = len(longer) == 1
        tokens = longer if certain else unknown
    if len(tokens) != 1:
        return
    (e,) = tokens
    items = _source.sequence_items(call.source_text(0) or "") or []
    past_label = items[0] if len(items) == 2 else "the cache"
    new_label = items[1] if len(items) == 2 else "the new keys"
    grows, seq = (
        f"{name} (axis {i})" if (name := D.known_name(axes[i])) else f"axis {i}" for i in (d, e)
    )
    sequence = f"the sequence, {seq}," if certain else "the sequence,"
    yield Violation(
        "cache_axis",
        f"torch.cat: the cache {past_label} grows along {grows} with {new_label}: "
        f"a cache of keys or values grows along {sequence} one position per new token",
        (call.operand(past_label, past), call.operand(new_label, new)),
        f"concatenate along the sequence axis: torch.cat([{past_label}, {new_label}], dim={e})"
        if certain
        else "concatenate along the sequence axis, the one each new token adds a position to",
    )


def _masked(call):
    """(mask, its label, the keys (or scores), their label, the scores' shape) of a
    masking op, or None."""
    spec, args = call.spec, call.args
    if spec is _ops.by_name("masked_fill") and len(args) >= 3 and is_tensor(args[1]):
        fill = args[2]
        meta = call.meta(args[0])
        # The keys are the last axis where a query-key product tagged them so.
        keys_last = meta is not None and meta.tags[-1:] == ("k",)
        if isinstance(fill, int | float) and fill <= _HIDING and keys_last and args[0].dim() >= 2:
            scores = call.label(0, "scores")
            return args[1], call.label(1, "mask"), args[0], scores, tuple(args[0].shape)
        return None
    if spec is _ops.SDPA:
        bound = call.bound()
        q, k, mask = bound.get("query"), bound.get("key"), bound.get("attn_mask")
        if not all(is_tensor(t) for t in (q, k, mask)) or q.dim() < 2:
            return None
        label = call.label(3, "attn_mask") if len(args) > 3 else "attn_mask"
        return mask, label, k, call.label(1, "k"), (*q.shape[:-1], k.shape[-2])
    if spec is _ops.by_name("add") and len(args) >= 2:
        a, b = args[0], args[1]
        if not (is_tensor(a) and is_tensor(b)):
            return None
        for scores, mask, index in ((a, b, 1), (b, a, 0)):
            meta = call.meta(scores)
            is_scores = meta is not None and meta.role == "scores" and meta.tags[-1:] == ("k",)
            if is_scores and mask.is_floating_point() and mask.dim() >= 2:
                if mask.numel() >= scores.numel():
                    continue
                label = call.label(index, "mask")
                scores_label = call.label(1 - index, "scores")
                return mask, label, scores, scores_label, tuple(scores.shape)
    return None


def _cached_keys(call, keys) -> bool:
    """The scores' keys are cached + new: their axis was made by concatenating."""
    axes = call.dims(keys) if is_tensor(keys) else ()
    if not axes:
        return False
    axis = axes[-2] if call.spec is _ops.SDPA else axes[-1]
    roots = D.roots_of(axis)
    return len(roots) == 1 and roots[0].origin == _CONCATENATION


@rule(
    _ops.by_name("masked_fill"),
    _ops.by_name("add"),
    _ops.SDPA,
    kinds={"mask_cache_length": (ERROR, WARNING)},
    order=0,
)
def mask_key_length(call: CallView) -> Iterator[Violation]:
    """A mask whose key axis is not the cached + new keys of a decode step."""
    found = _masked(call)
    if found is None:
        return
    mask, label, keys, keys_label, target = found
    if len(target) < 2 or mask.dim() < 2:
        return
    sq, sk = int(target[-2]), int(target[-1])
    mq, mk = int(mask.shape[-2]), int(mask.shape[-1])
    if mk == sk or sk <= sq or not _cached_keys(call, keys):
        return
    cached = sk - sq
    op = call.spec.name
    shape = list(mask.shape)
    new = "token" if sq == 1 else "tokens"
    if (mq, mk) == (sq, sq):
        what = (
            f"is square over the {sq} new {new}, but the scores have {sk} keys ({cached} "
            f"cached + {sq} new): "
        )
        what += (
            "it fits only because it broadcasts, and hides nothing of the cache"
            if sq == 1
            else "it does not line up with them"
        )
        hint = (
            f"build the mask over cached + new keys, [1, {sk}]: the new query is the last "
            f"position and sees all {sk} keys"
            if sq == 1
            else f"build the mask over cached + new keys, [{sq}, {sk}]: the new queries are "
            f"the last {sq} positions, so query i sees keys 0..{cached} + i, e.g. "
            f"torch.ones({sq}, {sk}, dtype=torch.bool).tril({cached})"
        )
        severity = WARNING if sq == 1 else ERROR
    elif mk == cached:
        what = (
            f"covers the {cached} cached keys but not the {sq} new {new}: the scores have "
            f"{sk} keys ({cached} cached + {sq} new)"
        )
        hint = (
            "extend the padding mask by the new tokens at every step, e.g. "
            f"torch.cat([{label}, {label}.new_ones(batch, {sq})], dim=-1)"
        )
        severity = WARNING if mk == 1 else ERROR
    elif mk != 1:
        what = f"has {mk} keys, the scores {sk} ({cached} cached + {sq} new)"
        hint = f"the mask's key axis must cover cached + new keys: {sk}"
        severity = ERROR
    else:
        return
    yield Violation(
        "mask_cache_length",
        f"{op}: {label} {shape} {what}",
        (call.operand(label, mask), call.operand(keys_label, keys)),
        hint,
        severity=severity,
    )
