"""The HTML report of a diff: the two flows side by side, aligned by key in the
reference's order, the first divergence marked, and the text report above them.
Reuses the trace report's page (`report/_html_page`)."""

from ..report._html_page import ERROR_TRAP, PAGE, PAGE_CSS, escaped, fill_template
from .result import DiffResult

_CSS = """
table.flows { border-collapse:collapse; margin:12px 0; font:13px/1.4 ui-monospace,monospace; }
table.flows td, table.flows th { border:1px solid var(--line); padding:2px 8px; text-align:left; }
tr.agree td.state { color:var(--ok); }
tr.diverge td { background:#fde7e7; font-weight:700; }
tr.diverge td.state { color:var(--err); }
tr.unseen td { color:var(--muted); }
pre.report { background:var(--bg); padding:10px; border:1px solid var(--line); white-space:pre-wrap; }
"""


def render_diff_html(result: DiffResult) -> str:
    """One self-contained page (no script of its own beyond the error trap)."""
    flows = result.flows
    ref_keys, port_keys = flows.get("ref", []), flows.get("port", [])
    agree, first = set(flows.get("agree", [])), flows.get("first")
    port_set, ref_set = set(port_keys), set(ref_keys)
    rows = []
    for key in ref_keys:
        if key == first:
            state, css = "first divergence", "diverge"
        elif key in agree:
            state, css = "agrees", "agree"
        elif key not in port_set:
            state, css = "reference only", "unseen"
        else:
            state, css = "not compared", "unseen"
        right = escaped(key) if key in port_set else ""
        rows.append(
            f'<tr class="{css}"><td>{escaped(key)}</td><td>{right}</td>'
            f'<td class="state">{state}</td></tr>'
        )
    for key in port_keys:
        if key not in ref_set:
            rows.append(
                f'<tr class="unseen"><td></td><td>{escaped(key)}</td><td>port only</td></tr>'
            )
    verdict = "agree" if result.agree else "diverge"
    body = (
        f'<pre class="report">{escaped(str(result))}</pre>'
        '<table class="flows"><tr><th>reference: '
        f"{escaped(result.ref_name)}</th><th>port: {escaped(result.port_name)}</th>"
        f"<th>state</th></tr>{''.join(rows)}</table>"
    )
    header = (
        f'<header><h1>shapeguard diff</h1><p class="summary">{escaped(result.port_name)} '
        f"against {escaped(result.ref_name)}: {verdict}</p></header>"
    )
    return fill_template(
        PAGE,
        title=escaped(f"shapeguard diff: {verdict}"),
        trap=ERROR_TRAP,
        css=PAGE_CSS + _CSS,
        header=header,
        nav="",
        body=body,
        hover="{}",
        script="",
    )
