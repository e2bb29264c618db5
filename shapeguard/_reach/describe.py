"""What an attention site's reach looks like, in words: a description, never a claim.

`describe(reach)` is the one line the terminal table shows per site (`causal`, `window 4`,
`documents 3`, `query 5 sees keys 0..5 (6 of 9)`, `+ padding: keys 7..8 in example 1`).
It names the pattern the rows follow: every key; causal (query i sees keys 0..i, or
0..past+i after `past = seq_k - seq_q` cached keys); a window of w keys; n documents
(block-diagonal, or causal inside each); else the row of the last query. Padding is what
the intent says (`reach.padding`) or, without it, the keys no query of an example sees;
queries at padded positions are left out of the pattern (implementations fill their rows
in different ways). Where slices differ, each example (or head) is said apart.

The words say what the rows are; whether that is right is `invariants.judge`'s question.
"""

from collections.abc import Iterable, Sequence

from .rows import Reach, Runs, count, runs_text

# Groups of examples (or heads) listed by name in one line; the rest are counted.
MAX_GROUPS = 3
# Runs of a row said in words at most (a scattered mask's row may hold thousands).
MAX_RUNS_SAID = 4


def example_axis(reach: Reach) -> int | None:
    """The leading axis that holds the examples: the one provenance names "batch", else the
    first (the scores' documented layout is [batch, heads, seq_q, seq_k]); None without one."""
    if "batch" in reach.lead_axes:
        return reach.lead_axes.index("batch")
    if reach.lead and (not reach.lead_axes or reach.lead_axes[0] in ("", "batch")):
        return 0
    return None


def describe(reach: Reach) -> str:
    """The one-line description of `reach` (see the module's docstring)."""
    if not reach.seq_q or not reach.seq_k:
        return f"no cell ({reach.seq_q} queries, {reach.seq_k} keys)"
    axis = example_axis(reach)
    padding = paddings(reach)
    texts = {index: slice_text(reach, index, pad) for index, pad in padded_slices(reach)}
    line = _said_apart(reach, texts)
    line += padding_text(reach, padding, axis)
    if reach.queries is not None:
        line += f" (from {len(reach.queries)} of {reach.seq_q} queries, sampled)"
    return line


def padded_slices(reach: Reach) -> list[tuple[tuple[int, ...], Runs]]:
    """Each stored leading index with its example's padded keys; where the rows are alike
    across examples but the intent's padding is not, one index per example."""
    axis = example_axis(reach)
    padding = paddings(reach)
    slices = list(reach.slices())
    if axis is not None and reach.stored[axis] == 1 and reach.padding:
        examples = range(min(len(reach.padding), reach.lead[axis]))
        slices = [(*s[:axis], e, *s[axis + 1 :]) for s in slices for e in examples]
    return [(s, padding.get(s[axis] if axis is not None else 0, ())) for s in slices]


def axis_noun(reach: Reach, axis: int) -> str:
    """What one index along leading axis `axis` is called: example, head, or its name."""
    examples = example_axis(reach)
    if axis == examples:
        return "example"
    named = reach.lead_axes[axis] if axis < len(reach.lead_axes) else ""
    if named:
        return "head" if named == "heads" else named
    if examples is not None and len(reach.lead) == 2:
        return "head"  # [batch, heads, seq_q, seq_k]: the other leading axis
    return f"axis {axis}"


# -- padding ------------------------------------------------------------------------------------
def paddings(reach: Reach) -> dict[int, Runs]:
    """The padded keys of each example (by its index along `example_axis`; 0 alone where
    there is none), only examples with some: the intent's (`reach.padding`), else the keys
    no query of the example sees (none derived from sampled queries: a key between the
    samples may be seen)."""
    if reach.padding:
        return {e: runs for e, runs in enumerate(reach.padding) if runs}
    if reach.queries is not None:
        return {}
    axis = example_axis(reach)
    examples = reach.stored[axis] if axis is not None else 1
    found = {}
    for example in range(examples):
        rows = [
            (q, reach.row(index, q))
            for index in reach.slices()
            if axis is None or index[axis] == example
            for q in reach.kept_queries
        ]
        unseen = _unseen(rows, reach.seq_q, reach.seq_k)
        if unseen:
            found[example] = unseen
    return found


def _unseen(rows: Sequence[tuple[int, Runs]], seq_q: int, seq_k: int) -> Runs:
    """The keys no row sees. A row that sees every key, of a query whose own position is
    unseen by the other rows and that sees later keys, is a padded query's row some
    implementations unmask (a softmax over nothing is NaN): it does not count, unless
    other rows look ahead too."""
    every = ((0, seq_k),)
    partial = [r for _, r in rows if r and r != every]
    candidate = subtract(every, union(partial))
    if not partial or candidate == every:
        return ()
    past = seq_k - seq_q
    # Such rows are unmasked padding only beside real rows that see no later key (a causal
    # decoder's, as transformers unmasks them): next to rows that look ahead, a row that
    # sees every key is a real one (an inverted triangle's first query), not padding.
    ahead = any(r[-1][1] - 1 > q + past for q, r in rows if r and r != every)
    for q, r in rows:
        pos = q + past
        if r == every and (ahead or not (_inside(pos, candidate) and pos < seq_k - 1)):
            return ()
    return candidate


def padding_text(reach: Reach, padding: dict[int, Runs], axis: int | None) -> str:
    """`+ padding: keys 7..8 in example 1` (examples with the same padded keys together)."""
    if not padding:
        return ""
    if axis is None:
        return f" + padding: {runs_text(padding[0])}"
    examples = reach.lead[axis]
    if len(padding) == 1 and 0 in padding and reach.stored[axis] == 1 and not reach.padding:
        where = " in every example" if examples > 1 else ""
        return f" + padding: {runs_text(padding[0])}{where}"
    groups: dict[Runs, list[int]] = {}
    for example, runs in padding.items():
        groups.setdefault(runs, []).append(example)
    parts = [
        f"{runs_text(runs)} in {indices_text(members, 'example')}"
        for runs, members in groups.items()
    ]
    return " + padding: " + _bounded(parts, "examples")


# -- one slice -------------------------------------------------------------------------------
def slice_text(reach: Reach, index: tuple[int, ...], padding: Runs) -> str:
    """The pattern of one leading slice's rows, or the row of its last real query."""
    rows = [(q, reach.row(index, q)) for q in reach.kept_queries]
    past = reach.seq_k - reach.seq_q
    real = [(q, r) for q, r in rows if not _inside(q + past, padding)] or rows
    # Rows that see keys the intent calls padding (its invariants flag them) are named as
    # they are, the padding not taken out.
    named = pattern(real, reach.seq_q, reach.seq_k, padding)
    if named is None and padding:
        named = pattern(real, reach.seq_q, reach.seq_k)
    if named is not None:
        return named
    q, runs = real[-1]
    return f"query {q} sees {bounded_runs_text(runs)} ({count(runs)} of {reach.seq_k})"


def bounded_runs_text(runs: Runs, limit: int = MAX_RUNS_SAID) -> str:
    """`runs_text` of at most `limit` runs: `keys 0..2, 4, 6, ... (1021 runs)` past it."""
    if len(runs) <= limit:
        return runs_text(runs)
    return f"{runs_text(runs[:limit])}, ... ({len(runs)} runs)"


def pattern(
    rows: Sequence[tuple[int, Runs]], seq_q: int, seq_k: int, padding: Runs = ()
) -> str | None:
    """The name of the pattern every (query, row) of `rows` follows, the `padding` keys
    taken out of each: "all keys", "causal", "window 4", "documents 3", ...; None if none.

    >>> pattern([(0, ((0, 1),)), (1, ((0, 2),)), (2, ((1, 3),))], 3, 3)
    'window 2'
    """
    if all(r == subtract(((0, seq_k),), padding) for _, r in rows):
        return "all keys"
    for past in dict.fromkeys((max(seq_k - seq_q, 0), 0)):
        cached = f", {past} cached keys" if past else ""
        if past == 0 and seq_k > seq_q:
            cached = " from key 0 (top-left)"  # the later keys are seen by no query
        ends = [min(q + past + 1, seq_k) for q, _ in rows]
        if all(r == subtract(((0, e),), padding) for (_, r), e in zip(rows, ends, strict=True)):
            return "causal" + cached
        width = _window(rows, ends, padding)
        if width is not None:
            return f"window {width}{cached}"
    if seq_q == seq_k:
        return _documents(rows, padding)
    return None


def _window(rows, ends: list[int], padding: Runs) -> int | None:
    """w where each query sees the w keys up to its own (fewer at the start), if some
    query sees fewer than all keys up to its own for want of room."""
    spans = [e - r[0][0] for (_, r), e in zip(rows, ends, strict=True) if r and r[-1][1] == e]
    if not spans:
        return None
    width = max(spans)
    if width >= max(ends):
        return None  # no row is cut by the window: that is causal (or something else)
    expected = [subtract(((max(e - width, 0), e),), padding) for e in ends]
    return width if all(r == x for (_, r), x in zip(rows, expected, strict=True)) else None


def _documents(rows, padding: Runs) -> str | None:
    """`documents n` (each query sees its whole document) or `documents n, causal` (the keys
    of its document up to its own), for n >= 2 documents that never see each other."""
    hulls = []
    for q, r in rows:
        if not r:
            return None
        hull = (r[0][0], r[-1][1])
        if r != subtract((hull,), padding) or not hull[0] <= q < hull[1]:
            return None
        hulls.append((q, hull))
    if all(stop == q + 1 for q, (_, stop) in hulls):
        starts = [start for _, (start, _) in hulls]
        for (_, (start, _)), (prior_q, (prior_start, _)) in zip(hulls[1:], hulls, strict=False):
            if start != prior_start and start <= prior_q:
                return None  # a new document starts after the queries of the one before
        n = len(set(starts))
        return f"documents {n}, causal" if n >= 2 else None
    distinct = sorted(set(h for _, h in hulls))
    if any(a[1] > b[0] for a, b in zip(distinct, distinct[1:], strict=False)):
        return None
    return f"documents {len(distinct)}" if len(distinct) >= 2 else None


# -- said apart where slices differ -----------------------------------------------------------------
def _said_apart(reach: Reach, texts: dict[tuple[int, ...], str]) -> str:
    """One text where every slice reads alike; else each group with its examples or heads."""
    distinct = list(dict.fromkeys(texts.values()))
    if len(distinct) == 1:
        return distinct[0]
    varying = [a for a in range(len(reach.lead)) if len({i[a] for i in texts}) > 1]
    groups: dict[str, list[tuple[int, ...]]] = {}
    for index, text in texts.items():
        groups.setdefault(text, []).append(index)
    if len(varying) == 1:
        (a,) = varying
        noun = axis_noun(reach, a)
        parts = [f"{text} in {indices_text([i[a] for i in m], noun)}" for text, m in groups.items()]
        return _bounded(parts, noun + "s", sep="; ")
    parts = [f"{text} in {_count(len(members), 'slice')}" for text, members in groups.items()]
    return _bounded(parts, "slices", sep="; ")


def indices_text(indices: Iterable[int], noun: str) -> str:
    """`example 1`, `examples 0, 2`, `heads 0..3, 6`."""
    ordered = sorted(set(indices))
    spans: list[list[int]] = []
    for i in ordered:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans)
    return f"{noun}{'s' if len(ordered) > 1 else ''} {text}"


def _bounded(parts: list[str], nouns: str, sep: str = ", ") -> str:
    if len(parts) <= MAX_GROUPS:
        return sep.join(parts)
    return (
        sep.join(parts[:MAX_GROUPS]) + f"{sep}and {len(parts) - MAX_GROUPS} more groups of {nouns}"
    )


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# -- runs as sets ---------------------------------------------------------------------------------
def union(rows: Iterable[Runs]) -> Runs:
    """The keys any of `rows` sees, as runs."""
    spans = sorted(run for runs in rows for run in runs)
    merged: list[tuple[int, int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return tuple(merged)


def subtract(runs: Runs, taken: Runs) -> Runs:
    """The keys of `runs` not in `taken`."""
    out: list[tuple[int, int]] = []
    for a, b in runs:
        start = a
        for c, d in taken:
            if d <= start or c >= b:
                continue
            if c > start:
                out.append((start, c))
            start = max(start, d)
        if start < b:
            out.append((start, b))
    return tuple(out)


def _inside(key: int, runs: Runs) -> bool:
    return any(a <= key < b for a, b in runs)
