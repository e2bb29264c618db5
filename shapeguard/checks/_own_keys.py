"""Which key holds each query's own position, where structure says so.

A row of scores that hides every key is a bug only for a real query, and a mask says a
query is padding when it hides that query's own position as a key from every query. That
reading needs to know which key is the query's own position. Sizes cannot say: a query
axis longer than the key axis may be queries against landmarks (segment means), against
another sequence (cross-attention), or a chunk against a cache. Only the axes' identities
can (`_names/dims.py`): the same axis on both sides (self-attention), or slices cut from
one axis (a cached chunk's queries cut from the positions its keys span).
"""

from collections.abc import Sequence

from .._names import dims as D
from .._names.dims import Axis

# How many slices of slices are followed back to the axis they were cut from.
_DEPTH = 8


def own_keys(queries: Axis, keys: Axis, seq_q: int, seq_k: int) -> list[int] | None:
    """For each of the `seq_q` queries, the index along the `seq_k` keys of its own
    position (-1 where its position is not among the keys); None where structure does
    not relate the two axes (then no query can be told from padding by the mask)."""
    q, k = D.normalize(queries), D.normalize(keys)
    if q and q == k:
        return list(range(seq_q)) if seq_q == seq_k else None
    q_origin, k_origin = _origin(q, seq_q), _origin(k, seq_k)
    if q_origin is None or k_origin is None or q_origin[0] != k_origin[0]:
        return None
    index = {position: j for j, position in enumerate(k_origin[1])}
    return [index.get(position, -1) for position in q_origin[1]]


def _origin(axis: Axis, size: int) -> tuple[tuple, Sequence[int]] | None:
    """(the atom `axis` was cut from, as (root, stride, size), and the positions of that
    atom it holds, in order), following slices back; None for an axis of several atoms."""
    if len(axis) != 1:
        return None
    root, stride, n = axis[0]
    if n != size:
        return None
    positions: Sequence[int] = range(n)
    for _ in range(_DEPTH):
        cut = root.cut
        if cut is None or not D.is_whole((root, stride, n)):
            break
        (parent, stride, n), kept = cut
        if len(kept) != root.size or any(not 0 <= p < len(kept) for p in positions):
            break
        positions = [kept[p] for p in positions]
        root = parent.find()
    return (root, stride, n), positions
