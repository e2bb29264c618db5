"""One site's reach as JSON data (the trace's `--json` `reach` list; docs/json-schema.md):
where it is, its sizes, its description, and its rows as runs of visible keys, bounded."""

from .describe import describe
from .rows import Reach

# Stored rows, and runs in the patterns they use, written per site at most: whole leading
# slices while both fit; the slices left out are counted in `slices_omitted` (all of them
# where one slice of a scattered mask holds more runs than that).
JSON_MAX_ROWS = 4096
JSON_MAX_RUNS = 16384  # a quarter of the runs a site may hold (`rows.MAX_RUNS`)


def reach_dict(reach: Reach) -> dict:
    """The site as plain data: `rows` holds, per stored leading slice, one pattern number per
    kept query; `patterns` the distinct rows as [start, stop) runs of visible keys."""
    kept = len(reach.kept_queries)
    slices = list(reach.slices())
    rows: list[list[int]] = []
    seen: set[int] = set()
    runs = 0
    for i in range(len(slices)):
        row = list(reach.rows[i * kept : (i + 1) * kept])
        new = set(row) - seen
        more = sum(len(reach.patterns[p]) for p in new)
        if (len(rows) + 1) * kept > max(JSON_MAX_ROWS, kept) or runs + more > JSON_MAX_RUNS:
            break
        rows.append(row)
        seen |= new
        runs += more
    written = len(rows)
    used = sorted(seen)
    number = {p: n for n, p in enumerate(used)}
    return {
        "site": reach.module,
        "event": reach.event,
        "op": reach.op,
        "location": reach.location,
        "how": reach.how,
        "lead": list(reach.lead),
        "lead_axes": list(reach.lead_axes),
        "stored": list(reach.stored),
        "seq_q": reach.seq_q,
        "seq_k": reach.seq_k,
        "summary": describe(reach),
        "count": reach.count,
        "queries": list(reach.queries) if reach.queries is not None else None,
        "patterns": [[list(run) for run in reach.patterns[p]] for p in used],
        "rows": [
            {"index": list(s), "pattern": [number[p] for p in row]}
            for s, row in zip(slices, rows, strict=False)
        ],
        "slices_omitted": len(slices) - written,
        "padding": [[list(run) for run in runs] for runs in reach.padding],
        "marks": [
            {"index": list(index), "query": query, "keys": [list(run) for run in runs]}
            for index, query, runs in reach.marks
        ],
    }
