"""One attention site's reach: for each example, head and query, the keys whose weight
can be non-zero, kept as runs of visible keys per distinct row.

A row is a sorted tuple of disjoint half-open runs `(start, stop)` of visible keys.
Rows that repeat (every head alike, every example alike, the rows of a window) are
stored once: `patterns` holds the distinct rows and `rows` one pattern number per
stored (lead..., query). Leading axes along which every row is alike are kept at size 1
(`stored`), so a causal mask broadcast over batch and heads costs `seq_q` patterns of
one run each. Past `MAX_QUERIES` queries only a stated sample of them is kept (the
first and last `EDGE` and evenly spaced ones between): memory stays bounded at long
sequences, at most `MAX_ROWS` stored rows (`from_visible` raises ValueError past
`MAX_ROWS // MIN_QUERIES` distinct leading slices, or past `MAX_RUNS` runs in all: the
caller records no reach there).

Nothing here holds a tensor: a trace keeps shapes, never tensors.
"""

from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

Runs = tuple[tuple[int, int], ...]

# Queries kept per (example, head) slice; beyond it a sample (`sampled_queries`).
MAX_QUERIES = 512
EDGE = 64  # the first and last queries a sample always keeps
# Stored rows in all (leading slices x kept queries): with many slices fewer queries are
# kept each (`sampled_queries`), never fewer than MIN_QUERIES; the transient bool tensor
# is at most MAX_ROWS x seq_k (64 MiB at 4096 keys).
MAX_ROWS = 1 << 14
# Runs kept per site in all: a scattered mask (random keys, a dropout-like pattern) has
# about seq_k / 2 runs per row, millions at 4096 keys; past this bound `from_visible`
# raises ValueError and the site records no reach rather than an unbounded one.
MAX_RUNS = 1 << 16
MIN_QUERIES = 8


@dataclass(frozen=True, slots=True)
class Reach:
    """What each query of one attention site can see.

    `lead` is the scores' leading shape (`[batch, heads]` usually, as the op broadcast
    it) and `lead_axes` names its axes where provenance does ("batch", "heads"; "" where
    it does not); `stored` is the leading shape of the stored rows (1 where every slice
    is alike). `queries` are the kept query indices (None: all `seq_q`)."""

    op: str  # the op the reach was read at: "softmax", "scaled_dot_product_attention", ...
    module: str  # module path ("" for the root or code outside any module)
    location: str  # the user's file:line
    lead: tuple[int, ...]
    seq_q: int
    seq_k: int
    stored: tuple[int, ...]
    patterns: tuple[Runs, ...]
    rows: array  # pattern number per stored (lead..., kept query), row-major
    queries: tuple[int, ...] | None = None
    # How the reach was read: "mask" (a mask's values), "causal" (is_causal), "unmasked",
    # "window" (flash-attn's window_size), "block_mask" (FlexAttention's mask_mod, and its
    # score_mod's -inf), "score_mod" (a score_mod's -inf alone), "cu_seqlens", "probe".
    how: str = "mask"
    lead_axes: tuple[str, ...] = ()
    event: int = -1  # the trace's event index of the op, -1 where none
    # What the established intent says (`invariants.judge` fills them; empty where no
    # intent is known): per example, the keys that are padding; and the cells an
    # invariant flags, as (leading index, query, runs of keys) each.
    padding: tuple[Runs, ...] = ()
    marks: tuple[tuple[tuple[int, ...], int, Runs], ...] = ()
    # How often the trace met this very reach at this site (every forward of a long trace,
    # every repeat of a layer's code: `TraceData.add_reach` folds them).
    count: int = 1

    # -- building --------------------------------------------------------------------
    @classmethod
    def from_visible(
        cls,
        visible: "torch.Tensor",
        lead: tuple[int, ...] | None = None,
        *,
        sampled: "tuple[tuple[int, ...], int] | None" = None,
        **where,
    ) -> "Reach":
        """The reach of a bool tensor `visible` (True where a key can be seen), shaped
        `[..., seq_q, seq_k]` and broadcastable to `lead + (seq_q, seq_k)`; axes of size 1
        stay so. `where` gives op, module, location, how, lead_axes, event. `sampled`
        (`(queries, seq_q)`, from `query_sample`) says `visible` holds only those query
        rows of `seq_q`: a caller that samples before it builds `visible` keeps it at most
        `MAX_ROWS` x seq_k."""
        import torch

        if visible.dim() < 2:
            raise ValueError(f"reach needs [..., seq_q, seq_k], got {tuple(visible.shape)}")
        sq, sk = int(visible.shape[-2]), int(visible.shape[-1])
        held = sq  # the query rows `visible` holds
        if sampled is not None:
            if len(sampled[0]) != sq:
                raise ValueError(f"reach: {sq} query rows for {len(sampled[0])} sampled")
            sq = sampled[1]
        given = tuple(int(s) for s in visible.shape[:-2])
        if lead is None:
            lead = given
        lead = tuple(int(s) for s in lead)
        if len(given) > len(lead):
            raise ValueError(f"reach: visible {tuple(visible.shape)} has more axes than {lead}")
        stored = (1,) * (len(lead) - len(given)) + given
        visible = visible.detach().to("cpu", torch.bool).reshape(*stored, held, sk)
        squeezed = _squeezed(visible, stored)
        for axis, (was, now) in enumerate(zip(stored, squeezed, strict=True)):
            if was != now:  # every slice alike along it: keep the first
                visible = visible.narrow(axis, 0, 1)
        stored = squeezed
        slices = prod(stored)
        if slices * MIN_QUERIES > MAX_ROWS:
            raise ValueError(f"reach: {slices} distinct slices is past {MAX_ROWS // MIN_QUERIES}")
        queries: tuple[int, ...] | None
        if sampled is not None:
            queries = sampled[0]
            if len(queries) * slices > MAX_ROWS:
                raise ValueError(
                    f"reach: {len(queries)} queries x {slices} slices is past {MAX_ROWS}"
                )
        else:
            queries = sampled_queries(sq, min(MAX_QUERIES, MAX_ROWS // slices))
            if queries is not None:
                visible = visible.index_select(-2, torch.tensor(queries))
        nq = len(queries) if queries is not None else sq
        flat = visible.reshape(slices * nq, sk)
        patterns, inverse = _distinct_runs(flat)
        return cls(
            lead=lead,
            seq_q=sq,
            seq_k=sk,
            stored=stored,
            patterns=patterns,
            rows=array("I", inverse),
            queries=queries,
            **{"op": "", "module": "", "location": "", **where},
        )

    @classmethod
    def from_runs(
        cls,
        runs: "list[Runs]",
        queries: tuple[int, ...] | None,
        seq_q: int,
        seq_k: int,
        lead: tuple[int, ...],
        **where,
    ) -> "Reach":
        """The reach whose kept `queries` of `seq_q` (None: all) each see `runs[i]`, alike
        in every leading slice: for a caller that knows the runs without a mask (packed
        documents from `cu_seqlens`, where a bool row would be as long as every token)."""
        patterns: dict[Runs, int] = {}
        rows = array("I", (patterns.setdefault(r, len(patterns)) for r in runs))
        return cls(
            lead=tuple(int(s) for s in lead),
            seq_q=int(seq_q),
            seq_k=int(seq_k),
            stored=(1,) * len(lead),
            patterns=tuple(patterns),
            rows=rows,
            queries=queries,
            **{"op": "", "module": "", "location": "", **where},
        )

    # -- reading ---------------------------------------------------------------------
    @property
    def kept_queries(self) -> tuple[int, ...]:
        return self.queries if self.queries is not None else tuple(range(self.seq_q))

    def row(self, index: tuple[int, ...], query: int) -> Runs:
        """The keys query `query` of leading slice `index` sees (broadcast axes read at 0).
        `query` must be kept (every query is, below `MAX_QUERIES`)."""
        if len(index) != len(self.lead):
            raise IndexError(f"reach: index {index} for leading shape {self.lead}")
        at = 0
        for i, size in zip(index, self.stored, strict=True):
            at = at * size + (i if size > 1 else 0)
        q = query if self.queries is None else self.queries.index(query)
        return self.patterns[self.rows[at * self._nq + q]]

    def sees(self, index: tuple[int, ...], query: int, key: int) -> bool:
        return any(a <= key < b for a, b in self.row(index, query))

    def slices(self) -> Iterator[tuple[int, ...]]:
        """The stored leading indices (0 along the axes where every slice is alike)."""
        for flat in range(prod(self.stored)):
            index = []
            for size in reversed(self.stored):
                index.append(flat % size)
                flat //= size
            yield tuple(reversed(index))

    def visible(self, index: tuple[int, ...]) -> "torch.Tensor":
        """The bool `[kept queries, seq_k]` of one leading slice, for drawing and checks."""
        import torch

        out = torch.zeros(len(self.kept_queries), self.seq_k, dtype=torch.bool)
        for i, q in enumerate(self.kept_queries):
            for a, b in self.row(index, q):
                out[i, a:b] = True
        return out

    @property
    def _nq(self) -> int:
        return len(self.queries) if self.queries is not None else self.seq_q

    def summary(self) -> str:
        """One line: what the last query of the first slice sees (`query 5 sees keys 0..5
        (6 of 9)`); the terminal table refines it."""
        index = tuple(0 for _ in self.lead)
        q = self.kept_queries[-1]
        runs = self.row(index, q)
        return f"query {q} sees {runs_text(runs)} ({count(runs)} of {self.seq_k})"


# -- helpers -------------------------------------------------------------------------------
def count(runs: Runs) -> int:
    return sum(b - a for a, b in runs)


def runs_where(flags) -> Runs:
    """The runs (start, stop) where `flags` (a sequence of bools) is True."""
    runs, start = [], None
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(flags)))
    return tuple(runs)


def runs_text(runs: Runs) -> str:
    """`keys 0..5`, `keys 0..2, 6..8`, `key 3` or `no key` (inclusive ends, as users read)."""
    if not runs:
        return "no key"
    if len(runs) == 1 and runs[0][1] - runs[0][0] == 1:
        return f"key {runs[0][0]}"
    parts = [f"{a}" if b - a == 1 else f"{a}..{b - 1}" for a, b in runs]
    return "keys " + ", ".join(parts)


def query_sample(lead: tuple[int, ...], seq_q: int) -> tuple[int, ...] | None:
    """The queries a site of leading shape `lead` keeps before it reads its values (None:
    all), so the rows it builds stay within `MAX_ROWS` whatever `from_visible` folds."""
    slices = max(1, prod(lead))
    if slices * MIN_QUERIES > MAX_ROWS:
        raise ValueError(f"reach: {slices} leading slices is past {MAX_ROWS // MIN_QUERIES}")
    return sampled_queries(seq_q, min(MAX_QUERIES, MAX_ROWS // slices))


def sampled_queries(seq_q: int, limit: int = MAX_QUERIES) -> tuple[int, ...] | None:
    """The queries kept of `seq_q`: all (None) up to `limit`, else the first and last
    `edge` (`EDGE`, or a quarter of `limit`) and evenly spaced ones between, `limit` in all."""
    if seq_q <= limit:
        return None
    edge = min(EDGE, limit // 4)
    middle = limit - 2 * edge
    span = seq_q - 2 * edge
    between = {edge + (i * span) // middle for i in range(middle)}
    return tuple(sorted({*range(edge), *between, *range(seq_q - edge, seq_q)}))


def _squeezed(visible, stored: tuple[int, ...]) -> tuple[int, ...]:
    """`stored` with 1 along every leading axis whose slices are all alike."""
    out = list(stored)
    for axis, size in enumerate(stored):
        if size > 1:
            first = visible.narrow(axis, 0, 1)
            if bool((visible == first).all()):
                out[axis] = 1
    return tuple(out)


def _distinct_runs(flat) -> tuple[tuple[Runs, ...], list[int]]:
    """The distinct rows of bool `[n, seq_k]` as runs, and each row's pattern number."""
    import torch

    if flat.shape[0] == 0:
        return (), []
    if flat.shape[1] == 0:  # no key at all: every row is the empty one
        return ((),), [0] * flat.shape[0]
    unique, inverse = torch.unique(flat, dim=0, return_inverse=True)
    edges = torch.diff(
        torch.nn.functional.pad(unique.to(torch.int8), (1, 1)), dim=-1
    )  # 1 where a run starts, -1 one past where it ends
    runs_in_all = int((edges == 1).sum())
    if runs_in_all > MAX_RUNS:
        raise ValueError(f"reach: {runs_in_all} runs of visible keys is past {MAX_RUNS}")
    starts = (edges == 1).nonzero().tolist()
    stops = (edges == -1).nonzero().tolist()
    runs: list[list[tuple[int, int]]] = [[] for _ in range(unique.shape[0])]
    for (row, a), (_, b) in zip(starts, stops, strict=True):
        runs[row].append((a, b))
    return tuple(tuple(r) for r in runs), inverse.tolist()
