"""The terminal report: the model and its inputs, the trace table (one row per attention
tensor, or per op) and the check summary, rendered with rich to plain text (or color)."""

import io
import os
import re

from .. import _ops
from .._roles import ROLES

# Ops that make or combine attention tensors, shown even when no role was found: the
# op table's `shown` ops, in every spelling an event may carry.
ATTENTION_OPS = _ops.shown_ops()
# The trace table's columns: (header, style, wraps). The shape column never wraps: it is
# the point of the table.
_COLUMNS = (
    ("#", "dim", False),
    ("module", "cyan", False),
    ("op", "", False),
    ("tensor", "bold", False),
    ("shape", "green", False),
    ("dtype", "dim", False),
    ("bytes", "dim", False),
    ("line", "dim", True),
)
_CHECK_STYLES = {"pass": "green", "FAIL": "bold red", "warn": "yellow", "skip": "dim"}
# A layer index: an all-digit part of a module path (`blocks.7.attn`).
_LAYER_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def render_target(picked, inputs) -> str:
    """The two lines above the table: the model (`_loader.Picked`) and its inputs
    (`_inputs.Inputs`), each input named after the forward parameter it goes to."""
    import inspect

    model = type(picked.model).__name__
    args = ", ".join(f"{k}={v!r}" for k, v in picked.kwargs.items())
    how = picked.how if picked.how == model else f"{model} from {picked.how}"
    try:
        names = list(inspect.signature(picked.model.forward).parameters)
    except (TypeError, ValueError):
        names = []
    shapes = [
        f"{names[i]}={_tensor_text(a)}" if i < len(names) else _tensor_text(a)
        for i, a in enumerate(inputs.args)
    ] + [f"{k}={_tensor_text(v)}" for k, v in inputs.kwargs.items()]
    return (
        f"model   {how}{f' ({args})' if args else ''}\n"
        f"inputs  {', '.join(shapes)}  (from {inputs.how})"
    )


def _tensor_text(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is None:
        return type(value).__name__
    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
    return f"[{', '.join(str(int(s)) for s in shape)}] {dtype}"


def attention_rows(trace, *, all_ops: bool = False) -> list[tuple[str, ...]]:
    """One row of cells per attention tensor (per op with `all_ops`), in `_COLUMNS` order."""
    rows = []
    for event in trace.events:
        out = event.outputs[0]
        if not all_ops and out.role not in ROLES and event.op not in ATTENTION_OPS:
            continue
        name = out.label or ""
        if out.role and out.role != name.removesuffix("^T"):
            name = f"{name} ({out.role})" if name else out.role
        rows.append(
            (
                str(event.index),
                event.module or event.module_type or "-",
                event.op,
                name,
                out.named_shape,
                out.dtype,
                _human_bytes(out.nbytes),
                os.path.basename(event.location),
            )
        )
    return rows


def fold_rows(rows, keep: set[str]) -> tuple[list, int]:
    """Leave out rows that repeat an earlier row in another layer; return (kept, folded count).

    A row is `(index, module, op, tensor, shape, dtype, bytes, line)` as `attention_rows`
    makes it; rows whose index is in `keep` are always kept.
    """
    seen: set[tuple] = set()
    kept, folded = [], 0
    for row in rows:
        index, module, *rest = row
        key = (_LAYER_INDEX.sub("*", module), *rest)
        if key in seen and index not in keep:
            folded += 1
            continue
        seen.add(key)
        kept.append(row)
    return kept, folded


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def summary_line(trace) -> str:
    """`20 ops in 5 modules; 0 errors, 0 warnings`."""
    return (
        f"{len(trace.events)} ops in {trace.modules_seen} modules; "
        f"{len(trace.errors)} errors, {len(trace.warnings)} warnings"
    )


def render_table(
    trace,
    *,
    width: int | None = 150,
    color: bool = False,
    all_ops: bool = False,
    fold: bool = False,
) -> str:
    """The trace as a table, then its findings; plain text unless `color`.

    With `fold`, a row that repeats an earlier row in another layer (`blocks.7.attn` for
    `blocks.0.attn`: same op, tensor, shape, dtype and source line) is left out, so an
    80-layer model reads as one layer plus the layers that differ; rows with a finding
    are always shown, and a line under the table counts the rows left out.
    """
    from rich.table import Table
    from rich.text import Text

    rows = attention_rows(trace, all_ops=all_ops)
    folded = 0
    if fold:
        rows, folded = fold_rows(rows, {str(f.event_index) for f in trace.findings})
    table = Table(title="shapeguard trace", title_justify="left", show_lines=False)
    for header, style, wrap in _COLUMNS:
        table.add_column(
            header,
            style=style if color else None,
            overflow="fold" if wrap else "ellipsis",
            no_wrap=not wrap,
        )
    for row in rows:
        # Text cells: "[batch=2, ...]" would otherwise be read as rich markup.
        table.add_row(*(Text(cell) for cell in row))
    lines = []
    if folded:
        repeat = (
            "rows not shown: they repeat rows" if folded != 1 else "row not shown: it repeats a row"
        )
        lines.append(
            f"{folded} {repeat} above in another layer, with the same op and shapes "
            "(--no-fold shows them)"
        )
    lines += _findings_lines(trace)
    return _render(table, lines, width=width, color=color).rstrip() + "\n"


def render_findings(trace) -> str:
    """The summary line and the findings, without the table (for a model that failed
    before its first op, whose table would be empty)."""
    return "\n".join(_findings_lines(trace)) + "\n"


def _findings_lines(trace) -> list[str]:
    return [summary_line(trace)] + [f"{f.severity}: {f.message}" for f in trace.findings]


def render_check(rows, *, width: int | None = 150, color: bool = False) -> str:
    """The `shapeguard check` summary: one (check, result, detail) row per check."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="shapeguard check", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for name, status, detail in rows:
        style = _CHECK_STYLES.get(status, "") if color else ""
        table.add_row(Text(name), Text(status, style=style), Text(detail))
    return _render(table, [], width=width, color=color)


def _render(table, lines: list[str], *, width: int | None, color: bool) -> str:
    """A rich table, then plain lines (never read as markup), as text."""
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        color_system="auto" if color else None,
        force_terminal=color,
        no_color=not color,
        legacy_windows=False,
    )
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False)
    return buffer.getvalue()
