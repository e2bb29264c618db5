"""The HTML report's page: its template, styles and scripts, and how values fill it."""

import html
import re


def fill_template(template: str, **values: str) -> str:
    # One pass, so braces in the CSS, the script or the values are left alone.
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], template)


def escaped(text) -> str:
    return html.escape(str(text), quote=True)


# -- page ------------------------------------------------------------------------------------------
# The first script only records errors (in the title and the body's data), so a
# test in a real browser can tell a broken page from a working one.
ERROR_TRAP = (
    "window.__errors=[];window.addEventListener('error',function(e){"
    "window.__errors.push(String(e.message));document.title='JS ERROR: '+e.message;"
    "if(document.body){document.body.setAttribute('data-js-error',String(e.message));}});"
)

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('heat-data').textContent);
  var tip = document.getElementById('tip');
  document.querySelectorAll('img.heat').forEach(function (img) {
    img.addEventListener('mousemove', function (ev) {
      var head = (data[+img.dataset.entry] || [])[+img.dataset.head];
      if (!head) { return; }
      var r = Math.min(head.length - 1, Math.floor(ev.offsetY / img.height * head.length));
      var c = Math.min(head[0].length - 1, Math.floor(ev.offsetX / img.width * head[0].length));
      tip.textContent = 'head ' + img.dataset.head + ', query ' + r + ', key ' + c + ': ' + head[r][c];
      tip.style.left = (ev.pageX + 12) + 'px';
      tip.style.top = (ev.pageY + 12) + 'px';
      tip.hidden = false;
    });
    img.addEventListener('mouseleave', function () { tip.hidden = true; });
  });
  document.body.setAttribute('data-ready', '1');
})();
"""

PAGE_CSS = """
:root { --fg:#1d2330; --muted:#5b6577; --line:#d9dee7; --bg:#f7f8fb; --err:#c62828;
  --warn:#d97706; --ok:#2e7d32; --accent:#3451b2; --unsure:#7b3fa0; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif; color:var(--fg);
  background:#fff; }
header { padding:18px 28px 8px; border-bottom:1px solid var(--line); background:var(--bg); }
h1 { margin:0 0 4px; font-size:22px; }
h2 { font-size:18px; margin:28px 0 10px; border-bottom:1px solid var(--line); padding-bottom:4px; }
nav { position:sticky; top:0; background:#fff; padding:6px 28px; border-bottom:1px solid var(--line);
  z-index:2; }
nav a { margin-right:16px; color:var(--accent); text-decoration:none; font-weight:600; }
main { padding:0 28px 40px; max-width:1400px; }
.summary { margin:0; color:var(--muted); }
.verdict { font-weight:700; padding:1px 8px; border-radius:10px; color:#fff; }
.verdict.ok { background:var(--ok); } .verdict.warning { background:var(--warn); }
.verdict.error { background:var(--err); } .verdict.inconclusive { background:var(--unsure); }
.note { color:var(--muted); } .note.ok { color:var(--ok); font-weight:600; }
code, pre { font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; font-size:12px; }
pre { margin:4px 0; white-space:pre-wrap; }
figure.flow { margin:0 0 24px; overflow-x:auto; }
figure.flow figcaption { font-weight:700; margin-bottom:6px; }
svg.diagram { display:block; max-width:100%; height:auto; }
svg .edge { fill:none; stroke:#8a94a6; stroke-width:1.6; }
svg .node rect { fill:#fff; stroke:#9aa5b8; stroke-width:1.4; }
svg .node.input rect { fill:#eef2f7; }
svg .node.proj rect, svg .node.split rect { fill:#f3f6ff; }
svg .node.scores rect, svg .node.mask rect, svg .node.softmax rect { fill:#fff8ec; }
svg .node.context rect, svg .node.merge rect, svg .node.out rect { fill:#f1faf3; }
svg .node.fused rect, svg .node.mha rect { fill:#f6f0ff; }
svg .node.warning rect { stroke:var(--warn); stroke-width:3; }
svg .node.error rect { stroke:var(--err); stroke-width:3; fill:#fff1f1; }
svg .node.failed rect { stroke-dasharray:6 4; }
svg a:hover rect { stroke:var(--accent); }
svg text { font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace; font-size:11px;
  fill:var(--fg); }
svg text.title { font-family:system-ui,sans-serif; font-weight:700; font-size:12px; }
svg text.meta, svg text.loc { fill:var(--muted); }
svg text.shape { fill:#1b5e20; font-weight:600; }
svg text.finding { fill:var(--err); }
svg .warning text.finding { fill:#9a4f00; }
svg circle.badge.error { fill:var(--err); } svg circle.badge.warning { fill:var(--warn); }
svg text.badge-text { fill:#fff; font-weight:700; text-anchor:middle; font-family:system-ui; }
ol.findings { padding-left:0; list-style:none; }
li.finding { border-left:5px solid var(--line); background:var(--bg); padding:6px 12px;
  margin-bottom:10px; }
li.finding.error { border-color:var(--err); } li.finding.warning { border-color:var(--warn); }
li.finding p { margin:0; } .num { font-weight:700; }
table { border-collapse:collapse; margin:6px 0 18px; }
caption { text-align:left; font-weight:700; padding:4px 0; }
th, td { padding:2px 8px; border-bottom:1px solid var(--line); text-align:left; vertical-align:top; }
td.num { text-align:right; font-variant-numeric:tabular-nums; }
table.source { width:100%; font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace; }
table.source td { border:none; padding:0 8px; }
table.source td.ln { color:var(--muted); text-align:right; width:3em; user-select:none; }
table.source tr.traced td.code { background:#f3f6ff; }
table.source tr.warning td.code { background:#fff4e0; } table.source tr.error td.code { background:#ffe9e9; }
table.source tr:target td { outline:2px solid var(--accent); }
table.source code { white-space:pre; }
table.source tr.note-row td { padding:2px 8px 8px; }
table.source tr.note-row pre { display:inline-block; vertical-align:top; margin:0 0 0 6px;
  border-left:4px solid var(--err); padding-left:8px; }
table.source tr.note-row.warning pre { border-color:var(--warn); }
.chip { display:inline-block; font-size:11px; background:#eef2f7; border-radius:8px; padding:0 6px;
  margin:1px 4px 1px 0; white-space:nowrap; }
.heatmaps .grid { display:flex; flex-wrap:wrap; gap:12px; }
.heatmaps figure { margin:0; text-align:center; font-size:12px; color:var(--muted); }
.reach-probe { display:flex; flex-wrap:wrap; gap:16px; }
.reach-probe figure { margin:0; text-align:center; font-size:12px; color:var(--muted); }
img.heat { image-rendering:pixelated; border:1px solid var(--line); display:block; }
.legend { color:var(--muted); margin-left:10px; white-space:nowrap; }
.ramp { display:inline-block; width:90px; height:10px; vertical-align:middle; border-radius:2px; }
table.memory tr.score td { background:#fff8ec; }
table.checks tr.fail td { background:#ffe9e9; } table.checks tr.skip td { color:var(--muted); }
table.checks tr.inconclusive td { background:#f4ecfa; } table.checks tr.inconclusive b { color:var(--unsure); }
td.bar { width:180px; } td.bar span { display:block; height:10px; background:#7b8fd1; border-radius:2px; }
#tip { position:absolute; background:#1d2330; color:#fff; font-size:12px; padding:2px 6px;
  border-radius:4px; pointer-events:none; }
"""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<script>{trap}</script>
<style>{css}</style>
</head>
<body>
{header}
<nav>{nav}</nav>
<main>{body}</main>
<div id="tip" hidden></div>
<script type="application/json" id="heat-data">{hover}</script>
<script>{script}</script>
</body>
</html>
"""
