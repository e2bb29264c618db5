"""What a mask's pattern says, for `mask_semantics`: polarity (an inverted triangle or
padding), direction (a triangle that hides the past), role (a padding mask on the
queries' axis), and a causal buffer used whole."""

from .._errors import Violation
from .._names.dims import BATCH
from ._mask_rows import all_hidden
from ._mask_uses import MaskUse, mask_operands
from .elementwise import ref


def triangle(hidden) -> str | None:
    """ "causal" (j > i), "inverse" (j <= i) or "past" (j < i), for every slice alike;
    the diagonal is offset by seq_k - seq_q too (queries at the end, as with a cache)."""
    sq, sk = hidden.shape[-2:]
    return _triangle_of(hidden.reshape(-1, sq, sk))


def _triangle_of(slices, counted=None) -> str | None:
    """The triangle `slices` [n, seq_q, seq_k] match on every cell, or on the `counted`
    cells only (the others may be anything)."""
    import torch

    sq, sk = slices.shape[-2:]
    step = (
        torch.arange(sk, device=slices.device)[None, :]
        - torch.arange(sq, device=slices.device)[:, None]
    )
    for offset in sorted({0, sk - sq}):
        for name, pattern in (
            ("causal", step > offset),
            ("inverse", step <= offset),
            ("past", step < offset),
        ):
            same = slices == pattern
            if counted is not None:
                same = same | ~counted
            if bool(same.all()):
                return name
    return None


def among_real(hidden) -> str | None:
    """`triangle` on the real queries and keys only: the rows that hide every key (padded
    queries) and the keys hidden from every query (padding) left out, slice by slice.
    None unless some slice keeps at least two of each, padding left something out, and the
    mask hides some real key from some real query: a mask that hides nothing among them
    (padding alone) matches a triangle whose hidden cells all fall outside them (Nyström's
    landmark queries against the keys, [2, 6] with the module's own padding first) and is
    no triangle."""
    sq, sk = hidden.shape[-2:]
    slices = hidden.reshape(-1, sq, sk)
    padded_q, padded_k = all_hidden(slices, -1), all_hidden(slices, -2)
    real = ~padded_q[:, :, None] & ~padded_k[:, None, :]
    if bool(real.all()) or not bool((slices & real).any()):
        return None
    enough = ((~padded_q).sum(-1) >= 2) & ((~padded_k).sum(-1) >= 2)
    if not bool(enough.any()):
        return None
    return _triangle_of(slices, counted=real)


def _inverse(label: str) -> str:
    """The spelling of a mask's negation: `mask == 0` for `mask == 1`, `~mask` for `mask`."""
    for a, b in ((" == 0", " != 0"), (" != 0", " == 0"), (" == 1", " == 0"), (" > 0", " == 0")):
        if label.endswith(a):
            return label[: -len(a)] + b
    return label[1:] if label.startswith("~") else f"~{ref(label)}"


def triangle_violation(call, use: MaskUse, triangle: str) -> Violation:
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
            mask_operands(call, use),
            f"{reads}; a causal mask hides the keys after each query: {fix}",
            severity="warning",
        )
    return Violation(
        "mask_direction",
        f"{use.op}: {use.label} hides the past instead of the future: each query sees "
        "itself and later keys only",
        mask_operands(call, use),
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


def padding_polarity(call, use: MaskUse, hidden) -> Violation | None:
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
        mask_operands(call, use),
        f"{reads}: pass {_inverse(use.label)}",
        severity="warning",
    )


def batch_as_query(call, use: MaskUse, hidden) -> Violation | None:
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


def query_axis(call, use: MaskUse, hidden) -> Violation | None:
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
        mask_operands(call, use),
        "a padding mask belongs on the key axis, [batch, 1, 1, seq_k]: build it from the "
        "[batch, seq] mask as mask[:, None, None, :], not mask[:, None, :, None]",
        severity="warning",
    )


def unsliced_buffer(call, use: MaskUse, triangle: str | None) -> Violation | None:
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
        mask_operands(call, use),
        f"slice it to the sequence, self.{meta.buffer}[{cut}] with T the current length, "
        "or any shorter input fails and a longer one cannot be masked",
        severity="warning",
    )
