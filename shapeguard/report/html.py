"""The HTML report: one self-contained file with the attention flow, findings, source,
heatmaps and memory of a trace.

`render_html(trace)` is a pure function of the trace's records (shapes, never
tensors): no network, no CDN, only inline CSS, SVG, PNG data URIs and a few
lines of JavaScript for hover read-outs; the page is complete without them.
Attention heatmaps need values, which a trace never keeps: get them from one
separate forward with `capture_attention(model, *inputs)` and pass the result
as `attention=`. `shapeguard trace FILE --html report.html` does both on cpu.
`render_fragment(trace)` is the part a notebook shows (`Trace._repr_html_`).
"""

import os

from . import _flow
from ._capture import capture_attention as capture_attention
from ._html_flow import flow_section
from ._html_heatmaps import heatmap_section, hover_data
from ._html_memory import memory_section
from ._html_page import ERROR_TRAP, PAGE, PAGE_CSS, SCRIPT, escaped, fill_template
from ._html_reach import REACH_CSS, reach_section
from ._html_reach_probe import probe_reach_section
from ._html_source import line_anchor, source_section

__all__ = ["capture_attention", "render_fragment", "render_html"]

_MAX_OPS_LISTED = 3000
CSS = PAGE_CSS + REACH_CSS


def render_html(
    trace,
    attention: dict | None = None,
    *,
    title: str = "shapeguard report",
    checks: list[tuple[str, str, str]] | None = None,
    probe_reach: dict | None = None,
) -> str:
    """One self-contained HTML page for `trace`.

    Args:
        trace: a `shapeguard.Trace`.
        attention: optional weights from `capture_attention(model, *inputs)`, drawn
            as per-head heatmaps for batch element 0. Omit it for a shapes-only report.
        title: the page title.
        checks: `shapeguard check`'s (check, status, detail) rows: a Checks section, and
            the verdict counts the failed ones.
        probe_reach: the reach `shapeguard check` measured (its reach probe's record,
            `result.reach.to_dict()`), drawn per example in a Measured reach section.

    Returns:
        The page, as a string; write it to a `.html` file and open it in any browser.

    Examples:
        >>> import torch, shapeguard
        >>> from shapeguard.report.html import render_html
        >>> page = render_html(shapeguard.trace(torch.nn.Linear(3, 4), torch.zeros(2, 3)))
        >>> page.startswith("<!DOCTYPE html>"), "http" in page
        (True, False)
    """
    blocks = _flow.build_blocks(trace)
    sections = [] if checks is None else [("checks", "Checks", _checks_section(checks))]
    if probe_reach is not None:
        sections.append(("measured-reach", "Measured reach", probe_reach_section(probe_reach)))
    sections += [
        ("flow", "Attention flow", flow_section(trace, blocks)),
        *([("reach", "Attention reach", reach_section(trace))] if trace.reach else []),
        ("findings", f"Findings ({len(trace.findings)})", _findings_section(trace)),
        ("source", "Source", source_section(trace)),
        ("heatmaps", "Attention weights", heatmap_section(trace, attention)),
        ("memory", "Memory", memory_section(trace)),
        ("ops", f"All ops ({len(trace.events)})", _ops_section(trace)),
    ]
    nav = "".join(f'<a href="#{key}">{escaped(name)}</a>' for key, name, _ in sections)
    body = "".join(
        f'<section id="{key}"><h2>{escaped(name)}</h2>{content}</section>'
        for key, name, content in sections
    )
    return fill_template(
        PAGE,
        title=escaped(title),
        css=CSS,
        trap=ERROR_TRAP,
        script=SCRIPT,
        header=_header(trace, title, checks),
        nav=nav,
        body=body,
        hover=hover_data(attention),
    )


# -- header ---------------------------------------------------------------------------
def _header(trace, title: str, checks=None) -> str:
    from .._version import __version__

    devices = sorted({r.device for e in trace.events for r in e.outputs}) or ["-"]
    errors, warnings = len(trace.errors), len(trace.warnings)
    status = "error" if errors else "warning" if warnings else "ok"
    verdict = (
        f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
        if errors or warnings
        else "no findings"
    )
    if checks is not None:
        status, verdict = _checks_verdict(checks, status)
    dropped = f" ({trace.dropped_events} more not recorded)" if trace.dropped_events else ""
    return (
        f"<header><h1>{escaped(title)}</h1>"
        f'<p class="summary"><span class="verdict {status}">{escaped(verdict)}</span> '
        f"{len(trace.events)} ops{dropped} in {trace.modules_seen} modules · "
        f"device {escaped(', '.join(devices))} · mode {escaped(trace.mode)}"
        f"{' (strict)' if trace.strict else ''} · shapeguard {escaped(__version__)}</p></header>"
    )


def _checks_verdict(checks, status: str) -> tuple[str, str]:
    """(css class, words) of the header's verdict over `shapeguard check`'s rows: an
    inconclusive probe proves nothing either way, so it is counted apart and never read
    as passed (nor as failed)."""
    results = [result for _, result, _ in checks]
    failed = results.count("FAIL")
    unsure = results.count("inconclusive")
    if failed:
        return "error", f"{failed} check{'s' * (failed != 1)} failed"
    if not unsure:
        return status, "all checks passed"
    return "inconclusive", f"none failed, {unsure} inconclusive"


# -- findings ---------------------------------------------------------------------------
def _findings_section(trace) -> str:
    if not trace.findings:
        return '<p class="note ok">No shape errors and no warnings.</p>'
    from .._trace.finding_groups import grouped

    numbers = {id(f): n for n, f in enumerate(trace.findings, start=1)}
    items = []
    for group in grouped(trace.findings):
        # One item for a finding repeated across layers; links to each repeat land on it.
        finding, number = group.first, numbers[id(group.first)]
        also = "".join(f'<span id="finding-{numbers[id(f)]}"></span>' for f in group.findings[1:])
        where = ""
        if finding.location:
            where = (
                f' at <a href="#{line_anchor(finding.location)}">{escaped(finding.location)}</a>'
            )
        items.append(
            f'<li id="finding-{number}" class="finding {escaped(finding.severity)}">{also}'
            f'<p><span class="num">#{number}</span> <b>{escaped(finding.severity)}</b> '
            f"<code>{escaped(finding.kind)}</code>{where}</p>"
            f"<pre>{escaped(group.message)}</pre></li>"
        )
    return f'<ol class="findings">{"".join(items)}</ol>'


# A check's row class by its result: a probe that does not apply reads as a skipped one.
_ROW_CLASS = {"n/a": "skip"}


def _checks_section(checks) -> str:
    rows = "".join(
        f'<tr class="{escaped(_ROW_CLASS.get(result, result.lower()))}"><td>{escaped(name)}</td>'
        f"<td><b>{escaped(result)}</b></td>"
        f"<td>{escaped(detail)}</td></tr>"
        for name, result, detail in checks
    )
    return (
        '<table class="checks"><thead><tr><th>check</th><th>result</th><th>detail</th></tr>'
        f"</thead><tbody>{rows}</tbody></table>"
    )


def render_fragment(trace) -> str:
    """The report's findings, attention flow, reach (where a site recorded one) and its
    table of ops, as one `<div>` with its own styles, for a notebook cell
    (`Trace._repr_html_`)."""
    from .text import attention_rows

    head = "".join(
        f"<th>{h}</th>" for h in ("#", "module", "op", "tensor", "shape", "dtype", "line")
    )
    rows = "".join(
        "<tr>" + "".join(f"<td>{escaped(c)}</td>" for c in (*row[:6], row[7])) + "</tr>"
        for row in attention_rows(trace)
    )
    return (
        f'<div class="shapeguard"><style>{_scoped_css()}</style>'
        f"<p>{escaped(_text_summary(trace))}</p>"
        f"{_findings_section(trace)}{flow_section(trace, _flow.build_blocks(trace))}"
        f"{reach_section(trace) if trace.reach else ''}"
        f'<table class="ops"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>'
    )


def _scoped_css() -> str:
    """The page's styles, each rule limited to `.shapeguard` (a notebook has its own page)."""
    rules = []
    for rule in CSS.split("}"):
        selectors, brace, body = rule.partition("{")
        if not brace:
            continue
        scoped = []
        for selector in selectors.split(","):
            selector = selector.strip()
            scoped.append(
                ".shapeguard" if selector in (":root", "body") else f".shapeguard {selector}"
            )
        rules.append(f"{', '.join(scoped)} {{{body}}}")
    return "\n".join(rules)


def _text_summary(trace) -> str:
    from .text import summary_line

    return summary_line(trace)


# -- all ops -------------------------------------------------------------------------------------
def _ops_section(trace) -> str:
    if not trace.events:
        return '<p class="note">No ops were recorded.</p>'
    rows = "".join(
        f"<tr><td>{e.index}</td><td>{escaped(e.module or e.module_type or '-')}</td><td>{escaped(e.op)}</td>"
        f"<td><code>{escaped(', '.join(r.named_shape for r in e.inputs[:3]))}</code></td>"
        f"<td><code>{escaped(', '.join((r.label + ' ' if r.label else '') + r.named_shape for r in e.outputs[:3]))}</code></td>"
        f"<td>{escaped(os.path.basename(e.location))}</td></tr>"
        for e in trace.events[:_MAX_OPS_LISTED]
    )
    more = len(trace.events) - _MAX_OPS_LISTED
    tail = f'<p class="note">{more} more ops not listed.</p>' if more > 0 else ""
    return (
        "<details><summary>every recorded op, its inputs and outputs</summary>"
        '<table class="ops"><thead><tr><th>#</th><th>module</th><th>op</th><th>inputs</th>'
        f"<th>outputs</th><th>line</th></tr></thead><tbody>{rows}</tbody></table>{tail}</details>"
    )
