"""Attention reach at every attention site: which keys each query can see, read from the
values that reach softmax or the kernel (`_reach_read`), kept on the trace and checked
against the intent that can be established (`_reach.invariants.judge`), and first
against the examples where the keys carry an established batch (`_reach.examples`).

The sites: a softmax over the last axis of scores whose last two axes a query-key product
made the queries and the keys (a key is hidden where the value is -inf or at or below the
mask reader's threshold, whatever code put it there), SDPA, nn.MultiheadAttention,
flash-attn's dense call (shapeguard.attention's `flash_attention`, `flash_attn_func`),
FlexAttention (its `mask_mod` and `score_mod`) and packed attention (`cu_seqlens`: torch's
`varlen_attn`, shapeguard.attention's `flash_attention_varlen`), the last two read by
`_fused_reach`.
The reach is handed to the session (`CallView.keep_reach`), which keeps it on the trace
(`TraceData.reach`, folded and bounded); the findings are the invariants' (all warnings).
Where no intent is established nothing is claimed: the reach is kept and shown only.
"""

import contextlib
from collections.abc import Iterator

from .. import _ops
from .._errors import Violation
from .._reach import examples, invariants
from . import WARNING, rule
from ._reach_read import reach
from ._view import CallView

# What `invariants.judge` reports (docs/errors.md): each a broken invariant of the reach.
KINDS = {
    kind: WARNING
    for kind in (
        "reach_other_example", "reach_padded_key", "reach_no_key", "reach_future",
        "reach_window", "reach_documents", "reach_decode",
    )
}  # fmt: skip


_SITES = (
    _ops.by_name("softmax"),
    _ops.by_name("log_softmax"),
    _ops.SDPA,
    _ops.MHA,
    _ops.by_name("flash_attention"),
    _ops.by_name("flash_attn_func"),
    _ops.FLEX,
    _ops.VARLEN,
    _ops.by_name("flash_attention_varlen"),
    _ops.XFORMERS,
)


# Reach is read at every site; `off` turns it off for the process, only so that
# bench/reach.py can time the trace without it side by side (not public API).
_reading = True


@contextlib.contextmanager
def off() -> Iterator[None]:
    """No reach read while the block runs (the benchmark's baseline)."""
    global _reading
    before, _reading = _reading, False
    try:
        yield
    finally:
        _reading = before


@rule(*_SITES, kinds=KINDS, order=3)
def attention_reach(call: CallView) -> Iterator[Violation]:
    """Read this site's reach, hand it to the session, and report what the invariants
    find in it."""
    if not _reading:
        return
    import torch

    with torch.no_grad():
        found = reach(call)
    if found is None:
        return
    crossing = examples.judge(call, found)  # no other invariant means much past this one
    if crossing is not None:
        call.keep_reach(crossing[0])
        yield crossing[1]
        return
    judged, violations = invariants.judge(call, found)
    call.keep_reach(judged)
    yield from violations
