"""The terminal table: one row per attention tensor (or per op), rendered with rich."""

import io
import os

from .._roles import ROLES

# Ops that make or combine attention tensors, shown even when no role was found.
ATTENTION_OPS = frozenset(
    {
        "matmul",
        "bmm",
        "baddbmm",
        "einsum",
        "softmax",
        "masked_fill",
        "masked_fill_",
        "scaled_dot_product_attention",
        "multi_head_attention_forward",
        "where",
    }
)


def attention_rows(trace, *, all_ops: bool = False) -> list[tuple[str, ...]]:
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


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def render_table(
    trace, *, width: int | None = 150, color: bool = False, all_ops: bool = False
) -> str:
    """The trace as a table, then its findings; plain text unless `color`."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="shapeguard trace", title_justify="left", show_lines=False)
    for header, style, wrap in (
        ("#", "dim", False),
        ("module", "cyan", False),
        ("op", "", False),
        ("tensor", "bold", False),
        ("shape", "green", False),
        ("dtype", "dim", False),
        ("bytes", "dim", False),
        ("line", "dim", True),
    ):
        # The shape column never wraps: it is the point of the table.
        table.add_column(
            header,
            style=style if color else None,
            overflow="fold" if wrap else "ellipsis",
            no_wrap=not wrap,
        )
    for row in attention_rows(trace, all_ops=all_ops):
        # Text cells: "[batch=2, ...]" would otherwise be read as rich markup.
        table.add_row(*(Text(cell) for cell in row))
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
    summary = (
        f"{len(trace.events)} ops in {trace.modules_seen} modules; "
        f"{len(trace.errors)} errors, {len(trace.warnings)} warnings"
    )
    console.print(summary, highlight=False)
    for finding in trace.findings:
        console.print(f"{finding.severity}: {finding.message}", highlight=False, markup=False)
    return buffer.getvalue().rstrip() + "\n"
