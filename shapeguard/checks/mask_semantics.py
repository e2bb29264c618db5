"""Masks that broadcast and still hide the wrong positions.

Every way of masking scores (masked_fill with a large negative value, where with
one, an additive float mask, SDPA's attn_mask, nn.MultiheadAttention's attn_mask
and key_padding_mask) is reduced to one boolean tensor, `hidden`, True where a
key is hidden from a query, aligned to the scores `[..., seq_q, seq_k]`. The
rules read that tensor's pattern:

- polarity: the inverse of a causal triangle, or a padding mask that hides the
  real tokens (some row hides every key) -- True meant "keep" where the op reads
  "hide", or the reverse;
- direction: a triangle that hides the past instead of the future;
- role: a `[batch, seq]` padding mask that lines up with `[seq_q, seq_k]` only
  because batch == seq_q, or a mask that varies along the queries only;
- rows that hide every key although their query is a real token, and examples
  that hide every key from every query (an empty sequence); the rows of padded
  queries, whose own key no query sees, are how left-padded decoders and some
  encoders mask, and are left alone. Which key is a query's own, the axes'
  identities say (`_own_keys`), never their sizes; where they do not (cross-
  attention, landmark keys), only empty examples are reported. The message says
  what the op returns there, read from the fill value (or the mask's values) and
  the dtype;
- a causal buffer used whole, which fits only one sequence length;
- SDPA's is_causal with seq_q != seq_k, which aligns the triangle top-left.

Values are read only from small CPU tensors (never on meta), and messages give
positions and counts, never values.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard, cast

from .. import _ops
from .._errors import Violation
from .._names import axes as _axes
from .._names.dims import BATCH
from .._names.flow.waiting import read_along
from . import WARNING, is_tensor, rule
from ._own_keys import own_keys
from ._view import CallView
from .elementwise import ref, wait_for_softmax, where_arguments
from .mha import bind_arguments

if TYPE_CHECKING:
    # For the annotations only: torch loads when the first trace opens.
    import torch

# The ops that apply a mask to scores (the probes watch them too).
MASKING = (
    _ops.by_name("masked_fill"),
    _ops.by_name("where"),
    _ops.by_name("add"),
    _ops.SDPA,
    _ops.MHA,
)
_SOFTMAXES = (_ops.by_name("softmax"), _ops.by_name("log_softmax"))
_MASK_KINDS = {
    kind: WARNING
    for kind in (
        "mask_polarity", "mask_direction", "mask_axis", "mask_fully_masked",
        "causal_buffer_unsliced", "causal_alignment",
    )
}  # fmt: skip

# A fill value at or below this hides a key (−1e9, finfo.min and −inf all do).
_HIDING = -1e4
_MAX_VALUES = 1 << 24


@dataclass(slots=True)
class _Use:
    """One mask as an op applies it."""

    op: str  # how the message names the op
    label: str  # the user's name for the mask
    mask: "torch.Tensor | None"  # the mask tensor as given
    hidden: "torch.Tensor"  # bool tensor, True = hidden, right-aligned to len(target) axes
    target: tuple[int, ...]  # the scores' shape [..., seq_q, seq_k]
    # "keep" (True attends: SDPA), "hide" (True hides), "fill", "where" (True keeps the
    # scores: torch.where(keep, scores, fill)), "where_fill" (True takes the fill:
    # torch.where(hide, fill, scores)), "add"
    kind: str
    # What a row that hides every key gives: called only when such rows are reported
    # (with the bool [*target[:-1]] of those rows), so reading values costs nothing
    # on the ops that pass.
    effect: Callable[[object], str]
    # The tensor masked_fill, where or an addition masks (None for SDPA and
    # nn.MultiheadAttention, whose documented arguments say the axes and whose own
    # softmax reads the mask).
    scores: "torch.Tensor | None" = None
    # SDPA's and nn.MultiheadAttention's (query, key) tensors and the index of their
    # sequence axis: which key is each query's own position (`_own_keys`). Masked scores
    # hold both axes themselves.
    operands: "tuple[torch.Tensor, torch.Tensor, int] | None" = None


@rule(*(op for op in MASKING if op.name != "add"), kinds=_MASK_KINDS, order=2)
def check(call: CallView) -> Iterator[Violation]:
    """What a mask hides, read from its values: polarity, direction, axis, empty rows.

    SDPA and nn.MultiheadAttention say by their arguments which axes are the queries and
    the keys, and their own softmax reads the mask: everything is reported there. A mask
    applied to a tensor by masked_fill, where or an addition is judged on the tensor's
    last two axes only where a query-key product made them the queries and the keys
    (its tags); rows hidden whole are a claim about a softmax, so that finding waits for
    the softmax that reads the tensor over its last axis (`_names.flow.waiting`), and so
    does every finding on a tensor whose axes no product named."""
    import torch

    with torch.no_grad():
        found = False
        waits: list[Violation] = []
        for use in mask_uses(call):
            if use.kind == "combined" and found:
                break  # the rows are empty because of what was reported already
            known = use.scores is None or _axes_known(call, use.scores)
            patterns, rows = _findings(call, use, known)
            if use.scores is None:
                for violation in (*patterns, *([rows] if rows is not None else [])):
                    found = True
                    yield violation
                continue
            if known:
                for violation in patterns:
                    found = True
                    yield violation
            else:
                waits.extend(patterns)
            if rows is not None:
                waits.append(rows)
            if waits:
                # One use per op that masks a tensor (masked_fill, where, an addition).
                wait_for_softmax(call, waits, use.target)
                break
        if call.spec is _ops.SDPA:
            yield from _check_is_causal(call)


@rule(_ops.by_name("add"), kinds=_MASK_KINDS, order=2, operands=2)
def added_mask(call):
    """A mask added to the scores: `check`, on additions of two tensors only."""
    yield from check(call)


@rule(*_SOFTMAXES, kinds={**_MASK_KINDS, "mask_dtype": WARNING}, order=2)
def read_by_softmax(call: CallView) -> Iterator[Violation]:
    """The findings that waited for a softmax over the last axis of the masked tensor
    (`check`, `elementwise.bool_mask_added`): this softmax makes them true."""
    p = call.bound()
    x, dim = p.get("input"), p.get("dim")
    if not _has_shape(x) or not isinstance(dim, int) or isinstance(dim, bool):
        return
    waiting = read_along(x, dim)
    if waiting is not None:
        yield from waiting.findings


def _axes_known(call, scores) -> bool:
    """The last two axes of `scores` are the queries and the keys by structure: a
    query-key product tagged them so, and the ops since kept the tags."""
    meta = call.meta(scores)
    if meta is None:
        return False
    tags = meta.tags
    return len(tags) == scores.dim() >= 2 and tags[-2] == "q" and tags[-1] == "k"


# -- reading values ------------------------------------------------------------------
def _has_shape(value) -> TypeGuard["torch.Tensor"]:  # what torch dispatches: a tensor
    return is_tensor(value)


def _readable(t) -> TypeGuard["torch.Tensor"]:
    """A plain CPU tensor small enough to read: never meta, fake or on an accelerator."""
    return (
        hasattr(t, "device")
        and type(t).__name__ in ("Tensor", "Parameter", "Buffer")
        and t.device.type == "cpu"
        and t.numel() <= _MAX_VALUES
    )


def _scalar(value) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hasattr(value, "numel") and value.numel() == 1 and _readable(value):
        return float(value.detach().reshape(()).item())
    return None


def aligned(hidden, ndim: int):
    """`hidden` with leading size-1 axes, so it lines up with a target of `ndim` axes."""
    while hidden.dim() < ndim:
        hidden = hidden.unsqueeze(0)
    return hidden


def _fits(shape, target) -> bool:
    return len(shape) <= len(target) and _axes.broadcast_shapes(tuple(shape), target) == target


# -- the mask of each op -------------------------------------------------------------------
def mask_uses(call):
    """The masks `call` applies to attention scores, as `_Use`s (none when the values
    cannot be read). The probes use it too, to tell a causal module from the trace."""
    op = call.spec.name
    args = call.args
    if op == "masked_fill":
        if len(args) < 3 or not hasattr(args[1], "dtype"):
            return
        x, mask = args[0], args[1]
        fill = _scalar(args[2])
        if fill is None or fill > _HIDING or mask.dtype.is_floating_point or x.dim() < 2:
            return
        if str(mask.dtype) != "torch.bool" or not _fits(mask.shape, tuple(x.shape)):
            return
        if _builds_a_mask(call, x):
            return
        if _readable(mask):
            effect = _fill_effect(fill, x.dtype)
            label = call.label(1, "mask")
            yield _Use("masked_fill", label, mask, mask, tuple(x.shape), "fill", effect, x)
    elif op == "where":
        yield from _where_use(call)
    elif op == "add":
        yield from _additive_use(call)
    elif call.spec is _ops.SDPA:
        yield from _sdpa_use(call)
    elif call.spec is _ops.MHA:
        yield from _mha_uses(call)


def _builds_a_mask(call, x) -> bool:
    """masked_fill on a fresh tensor builds a float mask (torch's own _canonical_mask does
    this inside nn.MultiheadAttention); the mask is checked where it is applied."""
    meta = call.meta(x)
    if meta is None and call.module is not None:
        return type(call.module).__module__.startswith("torch.nn")
    if meta is None or meta.role not in (None, "mask"):
        return False
    # Made by a factory (zeros, full, ones_like), or by a cast or copy of one.
    made_by = _ops.lookup(meta.op)
    return made_by.family == _ops.FACTORY or (made_by.family == _ops.SAME and made_by.keeps_value)


def _where_use(call):
    parts = where_arguments(call)
    if not all(name in parts for name in ("condition", "input", "other")):
        return
    (cond, label), (a, _), (b, _) = parts["condition"], parts["input"], parts["other"]
    if not hasattr(cond, "dtype") or str(cond.dtype) != "torch.bool":
        return
    values = [(a, _scalar(a)), (b, _scalar(b))]
    scores = [v for v, s in values if is_tensor(v) and s is None]
    if len(scores) != 1 or scores[0].dim() < 2 or not _readable(cond):
        return
    target = tuple(scores[0].shape)
    if not _fits(cond.shape, target):
        return
    if values[1][1] is not None and values[1][1] <= _HIDING:
        hidden, fill, kind = ~cond, b, "where"
    elif values[0][1] is not None and values[0][1] <= _HIDING:
        hidden, fill, kind = cond, a, "where_fill"
    else:
        return
    # Not None: the branch that chose `fill` compared this scalar with _HIDING.
    effect = _fill_effect(cast(float, _scalar(fill)), _result_type(scores[0], fill))
    yield _Use("torch.where", label, cond, hidden, target, kind, effect, scores[0])


def _additive_use(call):
    args = call.args
    if len(args) < 2 or not (hasattr(args[0], "dtype") and hasattr(args[1], "dtype")):
        return
    for scores, mask, index in ((args[0], args[1], 1), (args[1], args[0], 0)):
        # Cheap tests first: this runs on every addition (residuals included).
        if not mask.is_floating_point() or scores.dim() < 2 or mask.dim() < 2:
            continue
        target = tuple(scores.shape)
        if not _fits(mask.shape, target) or not _readable(mask):
            continue
        label = call.label(index, "mask")
        # Read the values only where the sum may be masked scores (this runs on every
        # addition: a residual's values are not read): scores or their weights by data flow,
        # or a tensor named as a mask. `check` judges the axes only where a product tagged
        # them; anything else waits for a softmax.
        roles = (call.role(mask, label), call.role(scores, call.label(1 - index, "scores")))
        if roles[0] != "mask" and roles[1] not in ("scores", "attn"):
            continue
        hidden = mask <= _HIDING
        # An additive mask is 0 where a key is kept; anything else is a bias (ALiBi, ...).
        if not bool(((mask == 0) | hidden).all()):
            continue
        effect = _additive_effect(scores, mask, target)
        yield _Use("scores + mask", label, mask, hidden, target, "add", effect, scores)
        return


def _sdpa_use(call):
    names = ("query", "key", "value", "attn_mask")
    p = dict(zip(names, call.args, strict=False))
    p.update({k: v for k, v in call.kwargs.items() if k in names})
    q, k, mask = p.get("query"), p.get("key"), p.get("attn_mask")
    if not (_has_shape(q) and _has_shape(k) and _has_shape(mask)):
        return
    if q.dim() < 2 or not _readable(mask):
        return
    target = (*q.shape[:-1], k.shape[-2])
    if not _fits(mask.shape, target) or call.kwargs.get("is_causal"):
        return
    label = call.label(3, "attn_mask") if len(call.args) > 3 else "attn_mask"
    op = "scaled_dot_product_attention"
    sides = (q, k, -2)
    if str(mask.dtype) == "torch.bool":
        yield _Use(op, label, mask, ~mask, target, "keep", lambda rows: _SDPA.nan, None, sides)
    elif mask.is_floating_point():
        effect = _values_effect(mask, target, _sdpa_dtype(q.dtype), _SDPA)
        yield _Use(op, label, mask, mask <= _HIDING, target, "add", effect, None, sides)


def _mha_uses(call):
    p = bind_arguments(call)
    query, key, heads = p.get("query"), p.get("key"), p.get("num_heads")
    if not (_has_shape(query) and _has_shape(key) and isinstance(heads, int)):
        return
    if query.dim() != 3 or key.dim() != 3 or p.get("bias_k") is not None or p.get("add_zero_attn"):
        return
    tgt, batch, src = int(query.shape[0]), int(query.shape[1]), int(key.shape[0])
    target = (batch, heads, tgt, src)
    hidden = None
    # The masks the op adds to the scores (it turns bool ones into -inf).
    values: list[torch.Tensor] = []
    # Read only when rows are reported, after both masks are in `values`; only the
    # combined use reports rows (see _findings).
    effect = _mha_effect(values, target, query.dtype, p.get("need_weights", True))
    am, kpm = p.get("attn_mask"), p.get("key_padding_mask")
    if _has_shape(am) and _readable(am):
        h = am if str(am.dtype) == "torch.bool" else am <= _HIDING
        if am.dim() == 3 and tuple(am.shape) == (batch * heads, tgt, src):
            h = h.reshape(batch, heads, tgt, src)
        elif tuple(am.shape) != (tgt, src):
            return  # the mha family reports the shape
        yield _Use("MultiheadAttention", "attn_mask", am, aligned(h, 4), target, "hide", effect)
        hidden = aligned(h, 4)
        values.append(aligned(am.reshape(h.shape), 4))
    if _has_shape(kpm) and _readable(kpm):
        if tuple(kpm.shape) != (batch, src):
            return
        h = (kpm if str(kpm.dtype) == "torch.bool" else kpm <= _HIDING)[:, None, None, :]
        yield _Use("MultiheadAttention", "key_padding_mask", kpm, h, target, "hide", effect)
        hidden = h if hidden is None else hidden | h
        values.append(kpm[:, None, None, :])
    if hidden is not None:
        # Rows the two masks hide together.
        yield _Use(
            "MultiheadAttention",
            "attn_mask | key_padding_mask",
            None,
            hidden,
            target,
            "combined",
            effect,
            None,
            (query, key, 0),  # [seq, batch, embed]: the functional form is sequence first
        )


# -- the rules -------------------------------------------------------------------------
def _findings(call, use: _Use, query_known: bool) -> tuple[list[Violation], Violation | None]:
    """What the mask's pattern says (polarity, direction, axis, a causal buffer used
    whole), and rows it hides whole (None when none, or when a pattern explains them).
    Without the queries' axis known, only what needs no more than the key axis."""
    hidden = aligned(use.hidden, len(use.target))
    if hidden.dim() != len(use.target) or len(use.target) < 2:
        return [], None
    if use.kind == "combined":
        return [], _fully_masked(call, use, hidden)
    patterns: list[Violation] = []
    readings: tuple = (_padding_polarity,)
    if query_known:
        sq, sk = use.target[-2:]
        hq, hk = hidden.shape[-2:]
        square = (hq, hk) == (sq, sk) and sq > 1 and sk > 1
        shape = triangle(hidden) if square else None
        if square and shape is None:
            # A causal mask ANDed with padding is judged by what the real queries see of
            # the real keys: a swapped triangle is that bug, whatever rows padding empties.
            among = _among_real(hidden)
            shape = among if among in ("inverse", "past") else None
        buffer = _unsliced_buffer(call, use, shape)
        if buffer is not None:
            patterns.append(buffer)
        if shape in ("inverse", "past"):
            patterns.append(_triangle_violation(call, use, shape))
            return patterns, None
        if shape == "causal":
            return patterns, None
        readings = (_padding_polarity, _batch_as_query, _query_axis)
    for reading in readings:
        violation = reading(call, use, hidden)
        if violation is not None:
            patterns.append(violation)
            return patterns, None
    if not query_known or (use.kind in ("hide", "keep") and use.op == "MultiheadAttention"):
        return patterns, None  # the combined use reports rows of nn.MultiheadAttention
    return patterns, _fully_masked(call, use, hidden)


def triangle(hidden) -> str | None:
    """ "causal" (j > i), "inverse" (j <= i) or "past" (j < i), for every slice alike;
    the diagonal is offset by seq_k - seq_q too (queries at the end, as with a cache)."""
    import torch

    sq, sk = hidden.shape[-2:]
    slices = hidden.reshape(-1, sq, sk)
    step = (
        torch.arange(sk, device=hidden.device)[None, :]
        - torch.arange(sq, device=hidden.device)[:, None]
    )
    for offset in sorted({0, sk - sq}):
        for name, pattern in (
            ("causal", step > offset),
            ("inverse", step <= offset),
            ("past", step < offset),
        ):
            if bool((slices == pattern).all()):
                return name
    return None


def _among_real(hidden) -> str | None:
    """`triangle` on the real queries and keys only: the rows that hide every key (padded
    queries) and the keys hidden from every query (padding) left out, slice by slice.
    None unless some slice keeps at least two of each, padding left something out, and the
    mask hides some real key from some real query: a mask that hides nothing among them
    (padding alone) matches a triangle whose hidden cells all fall outside them (Nyström's
    landmark queries against the keys, [2, 6] with the module's own padding first) and is
    no triangle."""
    import torch

    sq, sk = hidden.shape[-2:]
    slices = hidden.reshape(-1, sq, sk)
    padded_q, padded_k = _all(slices, -1), _all(slices, -2)
    real = ~padded_q[:, :, None] & ~padded_k[:, None, :]
    if bool(real.all()) or not bool((slices & real).any()):
        return None
    enough = ((~padded_q).sum(-1) >= 2) & ((~padded_k).sum(-1) >= 2)
    if not bool(enough.any()):
        return None
    step = (
        torch.arange(sk, device=hidden.device)[None, :]
        - torch.arange(sq, device=hidden.device)[:, None]
    )
    for offset in sorted({0, sk - sq}):
        for name, pattern in (
            ("causal", step > offset),
            ("inverse", step <= offset),
            ("past", step < offset),
        ):
            if bool(((slices == pattern) | ~real).all()):
                return name
    return None


def _operands(call, use: _Use):
    return (call.operand(use.label, use.mask),) if use.mask is not None else ()


def _inverse(label: str) -> str:
    """The spelling of a mask's negation: `mask == 0` for `mask == 1`, `~mask` for `mask`."""
    for a, b in ((" == 0", " != 0"), (" != 0", " == 0"), (" == 1", " == 0"), (" > 0", " == 0")):
        if label.endswith(a):
            return label[: -len(a)] + b
    return label[1:] if label.startswith("~") else f"~{ref(label)}"


def _triangle_violation(call, use: _Use, triangle: str) -> Violation:
    if triangle == "inverse":
        what = "hides each query's own position and every earlier one, and keeps the future"
        reads = {
            "keep": "SDPA keeps the keys where a bool attn_mask is True",
            "hide": "nn.MultiheadAttention hides the keys where attn_mask is True (or -inf)",
            "fill": "masked_fill fills (hides) where the mask is True",
            "where": "torch.where keeps the scores where the condition is True",
            "where_fill": "torch.where puts the fill where the condition is True",
            "add": "the additive mask is -inf where keys are hidden",
        }[use.kind]
        fix = (
            f"pass {_inverse(use.label)}"
            if use.kind != "add"
            else "use torch.full((seq, seq), float('-inf')).triu(1), -inf above the diagonal"
        )
        return Violation(
            "mask_polarity",
            f"{use.op}: {use.label} {what}: it is the inverse of a causal mask",
            _operands(call, use),
            f"{reads}; a causal mask hides the keys after each query: {fix}",
            severity="warning",
        )
    return Violation(
        "mask_direction",
        f"{use.op}: {use.label} hides the past instead of the future: each query sees "
        "itself and later keys only",
        _operands(call, use),
        "tril and triu are swapped: a causal mask hides key j from query i when j > i, "
        "e.g. torch.ones(seq, seq, dtype=torch.bool).triu(1) marks the positions to hide",
        severity="warning",
    )


def _rows(hidden):
    """Rows along the key axis, one per (batch, head, query) slice the mask holds."""
    return hidden.reshape(-1, hidden.shape[-1])


def _monotone(rows) -> bool:
    """Each row hides a prefix or each row hides a suffix (the shape of padding)."""
    as_int = rows.to("cpu").int()
    if rows.shape[-1] < 2:
        return False
    steps = as_int[:, 1:] - as_int[:, :-1]
    return bool((steps <= 0).all()) or bool((steps >= 0).all())


def _padding_polarity(call, use: _Use, hidden) -> Violation | None:
    """A padding mask (varies along keys only) that hides every key of some example:
    it hides the real tokens and keeps the padding."""
    if hidden.shape[-2] != 1 or use.target[-1] < 2 or hidden.shape[-1] != use.target[-1]:
        return None
    rows = _rows(hidden)
    full = rows.all(-1)
    varied = rows.any(-1) & ~full
    # Right padding is the usual layout: a mask that hides a prefix of every padded row
    # and every key of some unpadded row has its polarity inverted. (A correct mask that
    # hides all of an empty sequence hides a suffix of the others.)
    steps = rows.int()[:, 1:] - rows.int()[:, :-1]
    if not (bool(full.any()) and bool(varied.any()) and bool((steps <= 0).all())):
        return None
    reads = {
        "keep": "SDPA keeps the keys where a bool attn_mask is True (the opposite of "
        "nn.MultiheadAttention's key_padding_mask)",
        "hide": "key_padding_mask is True where a key is padding",
        "fill": "masked_fill hides where the mask is True",
        "where": "torch.where keeps the scores where the condition is True",
        "where_fill": "torch.where puts the fill where the condition is True",
        "add": "an additive mask is -inf where a key is padding",
    }[use.kind]
    marks = {
        "keep": "its True marks padding",
        "where": "its True marks padding",
        "add": "its -inf marks the real tokens",
    }.get(use.kind, "its True marks the real tokens")
    return Violation(
        "mask_polarity",
        f"{use.op}: {use.label} hides every key of {int(full.sum())} example(s) and keeps the "
        f"padding of the others: {marks}",
        _operands(call, use),
        f"{reads}: pass {_inverse(use.label)}",
        severity="warning",
    )


def _batch_as_query(call, use: _Use, hidden) -> Violation | None:
    """A [batch, seq_k] padding mask read as [seq_q, seq_k] because batch == seq_q."""
    target = use.target
    if use.mask is None or len(target) < 3 or use.mask.dim() != 2:
        return None
    if hidden.shape[-2] != target[-2]:
        return None  # laid out on the key axis by the op itself (key_padding_mask)
    batch, sq = target[0], target[-2]
    if batch < 2 or tuple(use.mask.shape)[0] != batch or batch != sq:
        return None
    if call.kind(use.mask, 0) != BATCH:
        return None  # nothing says its rows are examples: a [seq_q, seq_k] mask it may be
    rows = _rows(hidden)
    if not _monotone(rows) or bool((rows == rows[:1]).all()):
        return None
    visible = (~rows).sum(-1)
    if bool((visible[1:] >= visible[:-1]).all()):
        return None  # widening rows: a prefix-LM or block-causal mask, not padding
    return Violation(
        "mask_axis",
        f"{use.op}: {use.label} {list(use.mask.shape)} lines up with [seq_q, seq_k] only because "
        f"batch == seq_q == {batch}: its rows are the examples' padding, so example i's padding "
        "hides keys from query i of every example",
        (call.operand(use.label, use.mask),),
        f"a [batch, seq_k] padding mask goes on [batch, 1, 1, seq_k]: use {ref(use.label)}[:, None, None, :]",
        severity="warning",
    )


def _query_axis(call, use: _Use, hidden) -> Violation | None:
    """A mask that varies along the queries and is broadcast along the keys."""
    sq, sk = use.target[-2:]
    if hidden.shape[-1] != 1 or sk < 2 or hidden.shape[-2] != sq or sq < 2:
        return None
    columns = hidden[..., 0]
    if not bool((columns.any(-1) & ~columns.all(-1)).any()):
        return None
    shape = list(use.mask.shape) if use.mask is not None else list(hidden.shape)
    return Violation(
        "mask_axis",
        f"{use.op}: {use.label} {shape} varies along seq_q and is broadcast along seq_k: "
        "it hides whole queries, and every query still sees the padded keys",
        _operands(call, use),
        "a padding mask belongs on the key axis, [batch, 1, 1, seq_k]: build it from the "
        "[batch, seq] mask as mask[:, None, None, :], not mask[:, None, :, None]",
        severity="warning",
    )


_READS = {
    "keep": "SDPA keeps the keys where a bool attn_mask is True",
    "hide": "nn.MultiheadAttention hides the keys where a bool mask is True",
    "fill": "masked_fill hides where the mask is True",
    "where": "torch.where keeps the scores where the condition is True",
    "where_fill": "torch.where puts the fill where the condition is True",
    "add": "an additive mask is 0 where a key is kept and very negative where it is hidden",
    "combined": "nn.MultiheadAttention hides the keys where attn_mask or key_padding_mask "
    "is True, or -inf in a float mask",
}


def _fully_masked(call, use: _Use, hidden) -> Violation | None:
    """Rows that hide every key, where that is a bug: the query is a real token, or its
    whole (example, head) slice sees nothing (an empty sequence in the batch)."""
    full = _all(hidden, -1)  # [..., 1 or seq_q]
    if not bool(full.any()):
        return None
    empty = full.all(-1, keepdim=True)  # slices where no query sees any key
    real = full & ~_padded_queries(hidden, use.target, _own_keys_of(call, use))
    rows = (real | empty).expand(*use.target[:-1])
    if not bool(rows.any()):
        return None  # only padded queries: the layout of left (and some right) padding
    count, total = int(rows.sum()), rows.numel()
    first = [int(i) for i in rows.nonzero()[0]]
    names = ("batch", "heads", "query")[-len(first) :] if len(first) <= 3 else None
    at = ", ".join(f"{n} {i}" for n, i in zip(names, first, strict=True)) if names else str(first)
    reads = _READS[use.kind]
    if bool((real & ~empty).any()):
        # Other queries see these rows' own positions as keys: the mask treats them as real
        # tokens. They may be real queries left with nothing (a shifted triangle, a flipped
        # mask), or padding hidden on the query axis only (hyunwoongko's [batch, 1, seq, 1]
        # with left padding): the hint names both, and claims neither.
        hint = (
            "each query must see at least one key, and other queries see these rows' own "
            "positions as keys, so the mask treats them as real tokens: if they are padding, "
            "hide them as keys too (padding goes on the key axis, [batch, 1, 1, seq_k]); else "
            f"check the mask's polarity ({reads}) and that a causal mask hides only the keys "
            "after each query, never its own"
        )
        if bool(empty.any()):
            hint += "; an example whose queries see no key at all is empty: drop it from the batch"
    else:
        hint = (
            "each query must see at least one key: an example whose queries see no key is all "
            f"padding (drop it from the batch) or its mask has the wrong polarity ({reads})"
        )
    return Violation(
        "mask_fully_masked",
        f"{use.op}: {use.label} hides every key from {count} of {total} query rows "
        f"(first at {at}): {use.effect(rows)}",
        _operands(call, use),
        hint,
        severity="warning",
    )


def _all(hidden, dim: int):
    """`hidden.all(dim)` for a bool tensor, as the minimum of its bytes: about 13x faster
    on CPU (torch 2.13, a [8, 1, 2048, 2048] mask: 2.7 ms instead of 35 ms), and this runs
    on every layer of a padded batch."""
    import torch

    if hidden.dtype != torch.bool or hidden.shape[dim] == 0:
        return hidden.all(dim)
    return hidden.view(torch.uint8).amin(dim).bool()


def _own_keys_of(call, use: _Use) -> list[int] | None:
    """Which key is each query's own position, read from the axes of the scores (or of
    SDPA's and nn.MultiheadAttention's query and key); None where structure does not say."""
    sq, sk = use.target[-2:]
    if use.scores is not None:
        meta = call.meta(use.scores)
        if meta is None or len(meta.dims) != use.scores.dim():
            return None
        return own_keys(meta.dims[-2], meta.dims[-1], sq, sk)
    if use.operands is None:
        return None
    query, key, at = use.operands
    if _same_view(query, key):
        return list(range(sq)) if sq == sk else None
    q_meta, k_meta = call.meta(query), call.meta(key)
    if q_meta is None or k_meta is None:
        return None
    if len(q_meta.dims) != query.dim() or len(k_meta.dims) != key.dim():
        return None
    return own_keys(q_meta.dims[at], k_meta.dims[at], sq, sk)


def _same_view(a, b) -> bool:
    """One tensor, or two views of one in the same layout: nn.MultiheadAttention's
    self-attention (query = key = value), transposed for the functional form."""
    if a is b:
        return True
    base = getattr(a, "_base", None)
    return (
        base is not None
        and base is getattr(b, "_base", None)
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
    )


def _padded_queries(hidden, target, own: list[int] | None):
    """Where query i is padding: its own key (`own[i]`) is hidden from every query of its
    slice, as in left-padded decoders and in encoders that hide padded query rows too.
    [..., seq_q]. Where structure does not say which key is a query's own position
    (cross-attention, keys that are segment means, a cache joined by concatenation), or a
    query's position is not among the keys, nothing tells it from padding: all True, so
    only slices whose queries all see nothing are reported. All False where the mask is
    broadcast over the queries or the keys and so cannot tell."""
    import torch

    sq, sk = target[-2:]
    if tuple(hidden.shape[-2:]) != (sq, sk):
        return torch.zeros((), dtype=torch.bool)
    if own is None:
        return torch.ones((), dtype=torch.bool)
    unseen = _all(hidden, -2)  # [..., seq_k]: keys that no query of the slice sees
    index = torch.tensor(own, dtype=torch.long)
    return unseen[..., index.clamp(min=0)] | (index < 0)


# -- what a row that hides every key gives (measured on torch 2.13, CPU) -------------------
@dataclass(frozen=True, slots=True)
class _Texts:
    nan: str  # every key of the row is -inf
    even: str  # every key of the row gets the same logit
    weight: str  # finite logits that differ: the weight goes to hidden keys by score


_SOFTMAX = _Texts(
    "softmax gives NaN there",
    "softmax spreads those rows evenly over every key, hidden ones included",
    "softmax puts all of those rows' weight on hidden keys",
)
# Bool all-False rows and float all--inf rows: zeros, on the math and the CPU flash kernel.
_SDPA = _Texts(
    "SDPA returns zeros for them",
    "SDPA spreads those rows evenly over every key, hidden ones included (each gives the "
    "mean of V)",
    "SDPA puts all of those rows' weight on hidden keys",
)
_MHA = "nn.MultiheadAttention"
# need_weights=True computes softmax itself (NaN); need_weights=False calls SDPA (zeros).
_MHA_WEIGHTS = _Texts(
    f"{_MHA} returns NaN for them",
    f"{_MHA} spreads those rows evenly over every key, hidden ones included",
    f"{_MHA} puts all of those rows' weight on hidden keys",
)
_MHA_SDPA = _Texts(f"{_MHA} returns zeros for them", _MHA_WEIGHTS.even, _MHA_WEIGHTS.weight)
# A row of one value m with m + _ABSORBED == m swallows every score below _ABSORBED in
# magnitude, so the logits are equal (finfo.min of float32 or bfloat16). A smaller m
# (-1e4; float16's min once SDPA adds it in float32) only shifts the row, which softmax
# ignores: the row is weighted by its scores, as if unmasked.
_ABSORBED = 1024.0


def _in_dtype(value: float, dtype) -> float:
    """`value` as a tensor of `dtype` holds it: -1e9 is -inf in float16."""
    import torch

    if not dtype.is_floating_point:
        return value
    return float(torch.tensor(value, dtype=torch.float64).to(dtype))


def _result_type(a, b):
    import torch

    return torch.result_type(a, b)


def _sdpa_dtype(dtype):
    """The dtype SDPA adds a float mask in on CPU: float32 for float16 and bfloat16."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _row_values(t, target, rows):
    """What `t`, broadcast to `target`, holds in the reported `rows`: [n, seq_k]."""
    return aligned(t, len(target)).expand(target)[rows]


def _classify(logits, texts: _Texts) -> str:
    """The effect of softmax over `logits` [n, seq_k], the reported rows."""
    import torch

    if bool(torch.isneginf(logits).all(-1).any()):
        return texts.nan
    if bool((logits == logits[:, :1]).all()):
        return texts.even
    return texts.weight


def _fill_effect(fill: float, dtype):
    # Every key of the row holds the fill itself.
    text = _SOFTMAX.nan if _in_dtype(fill, dtype) == float("-inf") else _SOFTMAX.even
    return lambda rows: text


def _values_effect(mask, target, dtype, texts: _Texts):
    """From the mask's values alone, added to the scores in `dtype`."""
    import torch

    def effect(rows) -> str:
        values = _row_values(mask, target, rows).to(dtype)
        if bool(torch.isneginf(values).all(-1).any()):
            return texts.nan
        first = values[:, :1]
        if bool((values == first).all()) and bool((first + _ABSORBED == first).all()):
            return texts.even
        return texts.weight

    return effect


def _additive_effect(scores, mask, target):
    """From the logits themselves when the scores can be read, else from the mask."""

    def effect(rows) -> str:
        if _readable(scores):
            logits = _row_values(scores, target, rows) + _row_values(mask, target, rows)
            return _classify(logits, _SOFTMAX)
        return _values_effect(mask, target, _result_type(scores, mask), _SOFTMAX)(rows)

    return effect


def _mha_effect(values: list, target, dtype, need_weights):
    """nn.MultiheadAttention adds its masks to the scores in the query's dtype, bool
    ones as -inf; `values` is filled in by the caller before any row is reported."""
    import torch

    sdpa = need_weights is False
    texts = _MHA_SDPA if sdpa else _MHA_WEIGHTS

    def effect(rows) -> str:
        total = None
        for v in values:
            if str(v.dtype) == "torch.bool":
                v = torch.zeros(v.shape, dtype=dtype).masked_fill(v, float("-inf"))
            total = v.to(dtype) if total is None else total + v.to(dtype)
        return _values_effect(total, target, _sdpa_dtype(dtype) if sdpa else dtype, texts)(rows)

    return effect


def _unsliced_buffer(call, use: _Use, triangle: str | None) -> Violation | None:
    """A causal mask buffer used whole: right only when seq == the buffer's size."""
    if use.mask is None or triangle is None:
        return None
    meta = call.meta(use.mask)
    if meta is None or not meta.buffer or meta.sliced:
        return None
    n = use.mask.dim()
    cut = ", ".join([":"] * (n - 2) + [":T", ":T"])
    return Violation(
        "causal_buffer_unsliced",
        f"{use.op}: {use.label} is the whole buffer {meta.buffer} {list(use.mask.shape)}; it "
        f"fits the scores [.., seq_q={use.target[-2]}, seq_k={use.target[-1]}] only because "
        "the sequence is as long as the buffer",
        _operands(call, use),
        f"slice it to the sequence, self.{meta.buffer}[{cut}] with T the current length, "
        "or any shorter input fails and a longer one cannot be masked",
        severity="warning",
    )


def _check_is_causal(call):
    """is_causal=True aligns the triangle top-left: with a cache (seq_q < seq_k) the new
    queries, which are the last positions, see only the first keys."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
    p = dict(zip(names, call.args, strict=False))
    p.update({k: v for k, v in call.kwargs.items() if k in names})
    q, k = p.get("query"), p.get("key")
    if p.get("is_causal") is not True or p.get("attn_mask") is not None:
        return
    if not (_has_shape(q) and _has_shape(k)) or q.dim() < 2:
        return
    sq, sk = int(q.shape[-2]), int(k.shape[-2])
    if sq >= sk:
        return
    lq = call.label(0, "q")
    yield Violation(
        "causal_alignment",
        f"scaled_dot_product_attention(is_causal=True) with seq_q={sq} < seq_k={sk}: the "
        f"causal triangle is aligned top-left, so query i sees keys 0..i only, not the "
        f"{sk - sq} cached keys before it",
        (call.operand(lq, q), call.operand(call.label(1, "k"), k)),
        f"pass an explicit mask aligned bottom-right, attn_mask=torch.ones({sq}, {sk}, "
        f"dtype=torch.bool).tril({sk - sq}), and is_causal=False",
        severity="warning",
    )
