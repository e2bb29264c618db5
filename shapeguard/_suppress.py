"""`# shapeguard: ignore[kind]`: a comment that silences one kind of finding on its line.

A finding whose source line carries the comment with its kind (several kinds are
separated by commas: `# shapeguard: ignore[mask_polarity, softmax_axis]`) is moved from
the trace's findings to its `suppressed` list: it no longer fails a run, and the
summary still lists it. Only that line and only those kinds: a bare
`# shapeguard: ignore` names no kind and silences nothing. Pure Python: no torch.
"""

import linecache
import os
import re

_COMMENT = re.compile(r"#\s*shapeguard:\s*ignore\[([^\]]*)\]")


def kinds_ignored(location: str) -> frozenset[str]:
    """The kinds the comment on the line at `location` ("file:line") silences."""
    path, sep, line = location.rpartition(":")
    if not sep or not line.isdigit():
        return frozenset()
    text = linecache.getline(os.path.abspath(path), int(line))
    found = _COMMENT.search(text)
    if found is None:
        return frozenset()
    return frozenset(k.strip() for k in found.group(1).split(",") if k.strip())


def apply(trace) -> None:
    """Move the findings silenced on their own line to `trace.suppressed`."""
    kept = []
    for finding in trace.findings:
        if finding.kind in kinds_ignored(finding.location):
            trace.suppressed.append(finding)
        else:
            kept.append(finding)
    trace.findings[:] = kept
