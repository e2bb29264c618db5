"""Padded positions, which `diff` does not compare: where the inputs establish padding.

A padded query sees no real key, and where it sees no key at all its attention is
undefined (eager's softmax over a row of the dtype's minimum gives uniform weights, SDPA's
kernel another value): two correct backends differ there and no real token reads it. So
where the forward's `attention_mask` (transformers' documented (batch, seq) mask, 1 for a
real token, 0 for padding) has a 0, that position is not compared in any tensor with an
axis tied to the mask's.

The tie is never a guess: the seq axis is the axis the op's contract names `query` (or,
for K and V, `key`), else the one axis whose size is the mask's length; the batch axis
the one named `batch`, else the one other axis of the batch's size. Where two axes could
be either (batch == seq, heads == seq) the tensor is compared whole.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .capture import Captured

# The names an op's contract gives the positions of a tensor, in the order they are read.
SEQ_NAMES = ("query", "seq", "seq_q", "q_seq", "key", "seq_k", "k_seq")


@dataclass(slots=True)
class Padding:
    """The padded positions (True where the mask has a 0), (batch, seq)."""

    padded: Any
    source: str  # the input it was read from

    @property
    def count(self) -> int:
        return int(self.padded.sum())

    @property
    def total(self) -> int:
        return self.padded.numel()


def from_inputs(kwargs: Mapping[str, Any]) -> Padding | None:
    """The padding `attention_mask` establishes, or None: a 2-D mask of 0s and 1s (bool,
    integer or floating) with some 0 and some 1 in every row."""
    import torch

    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or mask.numel() == 0:
        return None
    values = mask.detach().to("cpu")
    if not bool(((values == 0) | (values == 1)).all()):
        return None  # an additive mask, or weights: not padding by position
    padded = values == 0
    if not bool(padded.any()) or bool(padded.all(-1).any()):
        return None
    return Padding(padded, "attention_mask")


def _seq_axis(c: Captured, length: int) -> int | None:
    shape = tuple(c.values.shape)
    for name in SEQ_NAMES:
        if name in c.axes:
            i = list(c.axes).index(name)
            return i if shape[i] == length else None
    found = [i for i, n in enumerate(shape) if n == length]
    return found[0] if len(found) == 1 else None


def _batch_axis(c: Captured, batch: int, seq_at: int) -> int | None:
    shape = tuple(c.values.shape)
    if "batch" in c.axes:
        i = list(c.axes).index("batch")
        return i if shape[i] == batch and i != seq_at else None
    found = [i for i, n in enumerate(shape) if n == batch and i != seq_at]
    return found[0] if len(found) == 1 else None


def skipped(c: Captured, padding: Padding) -> Any:
    """The elements of `c` at padded positions (a bool tensor broadcast to its shape), or
    None where no axis of `c` is tied to the mask's (then it is compared whole)."""
    batch, length = padding.padded.shape
    if c.values.dim() < 2:
        return None
    seq_at = _seq_axis(c, length)
    if seq_at is None:
        return None
    batch_at = _batch_axis(c, batch, seq_at)
    if batch_at is None:
        return None
    view = [1] * c.values.dim()
    view[batch_at], view[seq_at] = batch, length
    grid = padding.padded if batch_at < seq_at else padding.padded.T
    return grid.reshape(view).expand(c.values.shape)
