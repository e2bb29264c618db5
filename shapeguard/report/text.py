"""The terminal report: the model and its inputs, the trace table (one row per attention
tensor, or per op) and the check summary, rendered with rich to plain text (or color)."""

import io
import os
import re
import textwrap
from collections.abc import Iterable

from .. import _ops
from .._names.roles import ROLES
from .._values import dtype_name, is_tensor
from ._reach_text import table_lines

# Ops that make or combine attention tensors, shown even when no role was found: the
# op table's `shown` ops, in every spelling an event may carry.
ATTENTION_OPS = _ops.shown_ops()
# The trace table's columns, in order: header -> rich style. A narrow terminal drops bytes
# and dtype first, then shortens and drops module and op, then shortens the tensor's name;
# `#`, tensor, shape and line stay, and only the shape wraps, when nothing else is left.
_COLUMNS = {
    "#": "dim",
    "module": "cyan",
    "op": "",
    "tensor": "bold",
    "shape": "green",
    "dtype": "dim",
    "bytes": "dim",
    "line": "dim",
}
_FIT_STEPS = (
    ("drop", "bytes", 0),
    ("drop", "dtype", 0),
    ("shrink", "module", 8),
    ("shrink", "op", 6),
    ("drop", "module", 0),
    ("drop", "op", 0),
    ("shrink", "tensor", 10),
)
# As wide as a table can be when the output is not cut to a width.
_UNLIMITED = 100_000
_CHECK_STYLES = {
    "pass": "green",
    "FAIL": "bold red",
    "warn": "yellow",
    "inconclusive": "magenta",
    "skip": "dim",
    "n/a": "dim",
}
# A layer index: an all-digit part of a module path (`blocks.7.attn`).
_LAYER_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def render_target(picked, inputs, width: int | None = None) -> str:
    """The two lines above the table: the model (`picking.Picked`) and its inputs
    (`_inputs.Inputs`), each input named after the forward parameter it goes to. Given a
    `width`, a line longer than it wraps between its parts, under its label."""
    import inspect

    model = type(picked.model).__name__
    shown = getattr(picked, "shown", {})
    args = [f"{k}={shown.get(k) or repr(v)}" for k, v in picked.kwargs.items()]
    how = picked.how if picked.how == model else f"{model} from {picked.how}"
    try:
        params = list(inspect.signature(picked.model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    # Positional inputs after `*args` are `args[0]`, `args[1]`, ...
    star = next((i for i, p in enumerate(params) if p.kind is p.VAR_POSITIONAL), len(params))
    names = [p.name for p in params[:star]]
    notes = getattr(inputs, "notes", {})
    named = [
        (names[i] if i < star else f"{params[star].name}[{i - star}]" if params else "", a)
        for i, a in enumerate(inputs.args)
    ]
    shapes = [
        f"{name}={_value_text(name, value, notes)}" if name else _value_text(name, value, notes)
        for name, value in [*named, *inputs.kwargs.items()]
    ]
    # Two spaces before `(from ...)`: one the parts are joined by, one its own.
    # Inputs shapeguard made (not the user's own) say so: `(made up from ...)`.
    made = "made up " if getattr(inputs, "made", None) else ""
    tail = f"{' ' if shapes else '  '}({made}from {inputs.how})"
    return (
        _wrap("model   ", [how, *_listed(args, "(", ")")], width)
        + "\n"
        + _wrap("inputs  ", [*_listed(shapes, "", ""), tail], width)
    )


def _listed(items: list[str], opening: str, closing: str) -> list[str]:
    """`items` as the parts of one comma-separated list, each with its punctuation."""
    last = len(items) - 1
    return [
        f"{opening if i == 0 else ''}{item}{closing if i == last else ','}"
        for i, item in enumerate(items)
    ]


def _wrap(label: str, parts: list[str], width: int | None) -> str:
    """`label` and the parts joined by spaces; given a `width`, a part that would pass it
    starts a line of its own, indented under the label, and a part wider than a line is
    broken between its words."""
    if width is None:
        return label + " ".join(parts)
    room = max(width - len(label), 20)
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 1 + len(part) <= room:
            lines[-1] += " " + part
        else:
            lines.extend(textwrap.wrap(part.strip(), room) or [""])
    return "\n".join((label if i == 0 else " " * len(label)) + line for i, line in enumerate(lines))


def _value_text(name: str, value, notes: dict) -> str:
    """A tensor's shape and dtype, with what its values are when shapeguard made them
    (`ids < 101`); a dict or a dataclass of tensors field by field."""
    if is_tensor(value):
        note = notes.get(name)
        return tensor_text(value) + (f" ({note})" if note else "")
    import dataclasses

    if isinstance(value, dict) or dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        items: Iterable[tuple[object, object]]  # (key or field name, value)
        if isinstance(value, dict):
            items, form = value.items(), "{{{}}}"
            keys = {k: f"{name}[{k!r}]" for k in value}
        else:
            items = (
                vars(value).items()
                if not dataclasses.is_dataclass(value)
                else [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
            )
            form = type(value).__name__ + "({})"
            keys = {k: f"{name}.{k}" for k, _ in items}
        parts = [
            f"{k}: {_value_text(keys[k], v, notes)}"
            if isinstance(value, dict)
            else f"{k}={_value_text(keys[k], v, notes)}"
            for k, v in items
            if is_tensor(v)
        ]
        if parts:
            return form.format(", ".join(parts))
    return type(value).__name__


def tensor_text(value) -> str:
    """`[2, 16, 512] float32` for a tensor; the type's name of anything else."""
    if not is_tensor(value):
        return type(value).__name__
    return f"[{', '.join(str(int(s)) for s in value.shape)}] {dtype_name(value.dtype)}"


def attention_rows(trace, *, all_ops: bool = False) -> list[tuple[str, ...]]:
    """One row of cells per attention tensor (per op with `all_ops`), in `_COLUMNS` order."""
    rows: list[tuple[str, ...]] = []
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
                human_bytes(out.nbytes),
                os.path.basename(event.location),
            )
        )
    return rows


def fold_rows(rows, keep: set[str]) -> tuple[list, int]:
    """Leave out rows that repeat an earlier row in another layer; return (kept, folded count).

    A row is `(index, module, op, tensor, shape, dtype, bytes, line)` as `attention_rows`
    makes it; rows whose index is in `keep` are always kept, and so is every row of the
    first layer seen: only a module whose path differs from the earlier row's by its layer
    index (`blocks.7.attn` after `blocks.0.attn`) repeats it.
    """
    seen: dict[tuple, str] = {}
    kept, folded = [], 0
    for row in rows:
        index, module, *rest = row
        key = (_LAYER_INDEX.sub("*", module), *rest)
        first = seen.get(key)
        if first is not None and first != module and index not in keep:
            folded += 1
            continue
        seen.setdefault(key, module)
        kept.append(row)
    return kept, folded


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def summary_line(trace) -> str:
    """`20 ops in 5 modules; 0 errors, 0 warnings` (and `(3 shown: ...)` where findings
    repeated across layers or calls are grouped, `; 1 suppressed`, and the failures of shapeguard's
    own code it contained: `; 1 internal error (...)`)."""
    from .._trace.finding_groups import grouped

    suppressed = len(getattr(trace, "suppressed", ()))
    internal = sum(f.count for f in getattr(trace, "internal_errors", ()))
    shown = len(grouped(trace.findings))
    return (
        f"{_count(len(trace.events), 'op')} in {_count(trace.modules_seen, 'module')}; "
        f"{_count(len(trace.errors), 'error')}, {_count(len(trace.warnings), 'warning')}"
        + (
            f" ({shown} shown: a finding repeated across layers or calls is shown once)"
            if shown < len(trace.findings)
            else ""
        )
        + (f"; {suppressed} suppressed" if suppressed else "")
        + (
            f"; {_count(internal, 'internal error')} (shapeguard's own, contained: "
            "trace.internal_errors)"
            if internal
            else ""
        )
    )


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def render_table(
    trace,
    *,
    width: int | None = 150,
    color: bool = False,
    all_ops: bool = False,
    fold: bool = False,
    notes: tuple[str, ...] = (),
    every_op: str = "table(all_ops=True)",
) -> str:
    """The trace as a table, then `notes` (what the run could not check), its summary line
    and its findings; plain text unless `color`. A trace with ops but no attention tensor
    says so, and how to see every op (`every_op`: the caller's spelling of it).

    At `width` columns (None: as wide as the table needs, nothing cut or wrapped) the
    columns that matter least give way first (`_FIT_STEPS`).

    Under the table, one line per attention site says which keys its queries see
    (`causal + padding: keys 7..8 in example 1`: `_reach_text.table_lines`).

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
    shown, limits = fit_columns(rows, width)
    for header, style in _COLUMNS.items():
        if header in shown:
            table.add_column(
                header,
                style=style if color else None,
                overflow="fold" if header == "shape" else "ellipsis",
                no_wrap=header != "shape",
                max_width=limits.get(header),
            )
    keep = [i for i, header in enumerate(_COLUMNS) if header in shown]
    for row in rows:
        # Text cells: "[batch=2, ...]" would otherwise be read as rich markup.
        table.add_row(*(Text(row[i]) for i in keep))
    lines = []
    if not rows and not all_ops and trace.events:
        count = len(trace.events)
        lines.append(
            f"no attention tensor ({', '.join(ROLES)}) among its {count} "
            f"op{'s' if count != 1 else ''}: {every_op} lists them all"
        )
    if folded:
        repeat = (
            "rows not shown: they repeat rows" if folded != 1 else "row not shown: it repeats a row"
        )
        lines.append(
            f"{folded} {repeat} above in another layer, with the same op and shapes "
            "(--no-fold shows them)"
        )
    # One line per attention site: what its queries see (`_reach_text`).
    lines += table_lines(trace, fold=fold)
    lines += _findings_lines(trace, notes)
    return _render(table, lines, width=width, color=color).rstrip() + "\n"


def fit_columns(rows, width: int | None) -> tuple[list[str], dict[str, int]]:
    """The columns shown at `width` and the widths they are cut to ({} where uncut).

    >>> rows = [("3", "blocks.0.attn", "masked_fill", "scores", "[batch=2, heads=4, seq_q=5, seq_k=5]", "float32", "800 B", "model.py:26")]
    >>> fit_columns(rows, 80)[0]
    ['#', 'op', 'tensor', 'shape', 'line']
    >>> fit_columns(rows, None)[0] == list(_COLUMNS)
    True
    """
    natural = {
        header: max([len(header), *(len(row[i]) for row in rows)])
        for i, header in enumerate(_COLUMNS)
    }
    shown = list(_COLUMNS)
    limits: dict[str, int] = {}

    def total() -> int:
        return sum(limits.get(h, natural[h]) for h in shown) + 3 * len(shown) + 1

    if width is None:
        return shown, limits
    for step, header, floor in _FIT_STEPS:
        excess = total() - width
        if excess <= 0:
            break
        if step == "drop":
            shown.remove(header)
        elif header in shown:
            limits[header] = max(floor, natural[header] - excess, min(floor, natural[header]))
    return shown, limits


def render_findings(trace, notes: tuple[str, ...] = ()) -> str:
    """The summary line and the findings, without the table (for a model that failed
    before its first op, whose table would be empty)."""
    return "\n".join(_findings_lines(trace, notes)) + "\n"


def _findings_lines(trace, notes: tuple[str, ...] = ()) -> list[str]:
    lines = [f"note: {note}" for note in notes]
    from .._trace.finding_groups import grouped

    lines += [summary_line(trace)]
    lines += [f"{g.first.severity}: {g.message}" for g in grouped(trace.findings)]
    lines += [
        f"suppressed: {f.kind} at {f.location} (# shapeguard: ignore[{f.kind}])"
        for f in getattr(trace, "suppressed", ())
    ]
    return lines


def render_github(trace, checks=()) -> str:
    """GitHub Actions workflow commands: one `::error` / `::warning` line per finding (at its
    file and line, which GitHub shows as an annotation there), then one `::error` per
    failed check of `shapeguard check` (`checks`: its (check, status, detail) rows)."""
    from .._trace.finding_groups import grouped

    lines = []
    for group in grouped(trace.findings):
        finding = group.first
        path, _, line = finding.location.rpartition(":")
        where = f" file={_escape(path, True)},line={line}" if path and line.isdigit() else ""
        title = _escape(f"shapeguard {finding.kind}", True)
        level = "error" if finding.severity == "error" else "warning"
        lines.append(
            f"::{level}{where},title={title}::{_escape(group.message)}".replace(
                f"::{level},", f"::{level} ", 1
            )
        )
    findings = {f.kind for f in trace.findings}
    for name, status, detail in checks:
        if status == "FAIL" and name != "trace" and name not in findings:
            title = _escape(f"shapeguard check: {name}", True)
            lines.append(f"::error title={title}::{_escape(detail)}")
    return "".join(line + "\n" for line in lines)


def _escape(text: str, property: bool = False) -> str:
    """GitHub's escaping of a workflow command's message (and, more, of its properties)."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if property else text


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
        width=width or _UNLIMITED,
        color_system="auto" if color else None,
        force_terminal=color,
        no_color=not color,
        legacy_windows=False,
    )
    console.print(table)
    for line in lines:
        console.print(line, highlight=False, markup=False)
    return buffer.getvalue()
