"""The HTML report's source section: the lines of user code the trace ran through,
with the shapes and findings of each line."""

import linecache

from .._names.roles import ROLES
from ._html_page import escaped
from .text import ATTENTION_OPS


def _split_location(location: str) -> tuple[str, int] | None:
    path, _, line = location.rpartition(":")
    return (path, int(line)) if path and line.isdigit() else None


def line_anchor(location: str) -> str:
    found = _split_location(location)
    if found is None:
        return ""
    path, line = found
    slug = "".join(c if c.isalnum() else "-" for c in path)
    return f"line-{slug}-{line}"


def source_section(trace) -> str:
    files: dict[str, dict[int, dict]] = {}
    for event in trace.events:
        found = _split_location(event.location)
        if found is None:
            continue
        info = files.setdefault(found[0], {}).setdefault(
            found[1], {"source": "", "chips": {}, "findings": []}
        )
        info["source"] = info["source"] or event.source
        out = event.outputs[0] if event.outputs else None
        if out is not None and (out.role in ROLES or event.op in ATTENTION_OPS):
            info["chips"][out.label or out.role or event.op] = out.named_shape
    for number, finding in enumerate(trace.findings, start=1):
        found = _split_location(finding.location)
        if found is None:
            continue
        info = files.setdefault(found[0], {}).setdefault(
            found[1], {"source": "", "chips": {}, "findings": []}
        )
        info["findings"].append((number, finding))
        if not info["source"]:
            info["source"] = finding.source
    if not files:
        return '<p class="note">No source locations were recorded.</p>'
    return "".join(_source_file(path, lines) for path, lines in files.items())


def _source_file(path: str, touched: dict[int, dict]) -> str:
    readable = bool(linecache.getline(path, min(touched)))
    if readable:
        # Each traced line with two lines of context; far-apart parts joined by "...".
        wanted = {n for t in touched for n in range(max(1, t - 2), t + 3)}
        numbers = sorted(n for n in wanted if linecache.getline(path, n))
    else:
        numbers = sorted(touched)
    rows, previous = [], None
    for n in numbers:
        info = touched.get(n)
        text = (
            linecache.getline(path, n).rstrip("\n") if readable else (info or {}).get("source", "")
        )
        if not readable and not text:
            continue
        if previous is not None and n != previous + 1:
            rows.append('<tr class="gap"><td></td><td>...</td><td></td></tr>')
        previous = n
        classes = []
        chips = ""
        notes = ""
        if info is not None:
            classes.append("traced")
            chips = "".join(
                f'<span class="chip"><b>{escaped(label)}</b> {escaped(shape)}</span>'
                for label, shape in list(info["chips"].items())[-3:]
            )
            for number, finding in info["findings"]:
                classes.append(finding.severity)
                notes += (
                    f'<tr class="note-row {escaped(finding.severity)}"><td></td><td colspan="2">'
                    f'<a href="#finding-{number}">#{number}</a> <pre>{escaped(finding.message)}</pre></td></tr>'
                )
        anchor = line_anchor(f"{path}:{n}")
        rows.append(
            f'<tr id="{anchor}" class="{" ".join(dict.fromkeys(classes))}"><td class="ln">{n}</td>'
            f'<td class="code"><code>{escaped(text)}</code></td><td class="chips">{chips}</td></tr>{notes}'
        )
    caption = escaped(path) + ("" if readable else " (file not readable: traced lines only)")
    return f'<table class="source"><caption>{caption}</caption>{"".join(rows)}</table>'
