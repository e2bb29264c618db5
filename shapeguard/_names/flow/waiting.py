"""Findings that only a softmax makes true, carried from the op that found them to it.

"softmax gives NaN there" is a claim about a softmax: the rows a mask hides whole are a
bug only where a softmax over the keys reads them (a top-k over the same scores, or a
decay matrix that is exponentiated, is fine with them). A masking op's rule finds the
rows; what it found waits on the op's output, is carried through the ops that keep each
row what it was (casts, copies, dropout, + - * / with a bias or a scale, another mask),
and is reported by the rule of the softmax that reads the tensor along its last axis,
the axis the finding was made on. Any other op lets it go.

A rule hands what it found to the axis rule of the same call (`hand`, before the op
runs: the output does not exist yet), which leaves it on the output (`carry`). Tensors
are held weakly, by id checked against a weak reference, as the session's table does.
"""

import threading
import weakref
from typing import NamedTuple

from ... import _ops
from ..._values import is_tensor


class Waiting(NamedTuple):
    """What a rule found on a tensor of `shape`, true once a softmax reads its last axis."""

    findings: tuple
    shape: tuple[int, ...]


# Not memos (state between a call's rules and its axis rule, and on tensors alive).
# id(call) -> (call, what its rules handed, the thread): read by the call's own axis rule,
# after the op. A call's rules and its axis rule run in one dispatch on one thread, with no
# other call's between them: a hand of another call of the same thread is stale (its op
# raised, or a replay ran the rules only to compare values) and is dropped.
_HANDED: dict[int, tuple[object, Waiting, int]] = {}
# id(tensor) -> (weak reference, what waits on it).
_WAITING: dict[int, tuple[weakref.ref, Waiting]] = {}
_MAX_HANDED = 16  # threads' stale hands, at most

_SOFTMAXES = (_ops.by_name("softmax"), _ops.by_name("log_softmax"))
_MASKS = (_ops.by_name("masked_fill"), _ops.by_name("where"))


def hand(call, findings, shape) -> None:
    """Leave `findings` (made on a tensor of `shape`) to the output of `call`."""
    known = _take(call)
    before = known.findings if known is not None else ()
    if len(_HANDED) > _MAX_HANDED:
        _HANDED.clear()
    _HANDED[id(call)] = (call, Waiting((*before, *findings), tuple(shape)), threading.get_ident())


def _take(call) -> Waiting | None:
    """What `call`'s rules handed, removed, and this thread's stale hands dropped."""
    found = None
    thread = threading.get_ident()
    for key, (other, waiting, owner) in list(_HANDED.items()):
        if other is call:
            found = waiting
        elif owner != thread:
            continue
        _HANDED.pop(key, None)
    return found


def waiting_on(tensor) -> Waiting | None:
    entry = _WAITING.get(id(tensor))
    if entry is not None and entry[0]() is tensor:
        return entry[1]
    return None


def read_along(tensor, dim: int) -> Waiting | None:
    """What waits on `tensor` (or on the tensor it is a view of) when a softmax reads it
    along `dim`: only when `dim` is the last axis of the tensor the finding was made on."""
    if not _WAITING or not is_tensor(tensor) or not tensor.dim():
        return None
    ndim = tensor.dim()
    if dim % ndim != ndim - 1:
        return None
    found = waiting_on(tensor)
    if found is not None:
        return found if tuple(tensor.shape) == found.shape else None
    base = getattr(tensor, "_base", None)
    if base is None:
        return None
    found = waiting_on(base)
    if found is None or not base.is_contiguous() or not tensor.is_contiguous():
        return None
    # A view that regroups the leading axes keeps the last one (fairseq's
    # [bsz * heads, tgt, src] view of [bsz, heads, tgt, src] scores).
    return found if tensor.shape[-1] == found.shape[-1] else None


def _leave(tensor, waiting: Waiting) -> None:
    key = id(tensor)

    def gone(ref, key=key) -> None:
        entry = _WAITING.get(key)
        if entry is not None and entry[0] is ref:
            del _WAITING[key]

    _WAITING[key] = (weakref.ref(tensor, gone), waiting)


def _keeps_rows(spec) -> bool:
    """Ops after which a row hidden whole is still hidden whole, on the same axes."""
    if spec.family == _ops.SAME:
        return spec.keeps_value or spec.name == "dropout"
    if spec.family == _ops.BINARY:
        return spec.symbol in ("+", "-", "*", "/") or spec in _MASKS
    return False


def carry(call, outputs) -> None:
    """The axis rule's part, after the op: what the call's rules handed goes on its
    output; what waits on an input goes on to the output of an op that keeps the rows."""
    if not (_HANDED or _WAITING) or len(outputs) != 1:
        return
    out = outputs[0]
    handed = _take(call) if _HANDED else None
    if handed is not None:
        if tuple(out.shape) == handed.shape:
            _leave(out, handed)
        return
    spec = call.spec
    if not _WAITING or spec in _SOFTMAXES or not _keeps_rows(spec):
        return
    shape = tuple(out.shape)
    for t in call.tensors():
        found = waiting_on(t)
        if found is not None and found.shape == shape and tuple(t.shape) == shape:
            _leave(out, found)
            return
