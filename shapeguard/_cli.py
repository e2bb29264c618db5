"""The `shapeguard` command: trace, check and explain.

A thin click group over library functions (`_loader`, `_inputs`, `_explain`).
Exit statuses are carried by exception classes: 0 clean, 1 violations found or
the model crashed (`Failed`), 2 a usage or loading error (`UsageFailure`). The
report goes to stdout, diagnostics to stderr, and no traceback is shown unless
`--traceback` is given. torch is imported only by the commands that need it.
"""

import contextlib
import re
import sys
import traceback as _traceback

import click

from ._loader import LoadError, ModelCrashed
from ._version import __version__


class Failed(click.ClickException):
    """Violations were found or the model crashed: exit status 1, report already on stdout."""

    exit_code = 1

    def __init__(
        self, message: str, cause: BaseException | None = None, show_traceback: bool = False
    ):
        super().__init__(message)
        self.cause = cause
        self.show_traceback = show_traceback

    def show(self, file=None) -> None:
        if self.show_traceback and self.cause is not None:
            _traceback.print_exception(self.cause, file=sys.stderr)
        click.echo(f"shapeguard: {self.format_message()}", err=True)


class UsageFailure(Failed):
    """The command cannot run as given (file, model, options): exit status 2, one line on stderr."""

    exit_code = 2

    def show(self, file=None) -> None:
        if self.show_traceback and self.cause is not None:
            _traceback.print_exception(self.cause, file=sys.stderr)
        click.echo(f"shapeguard: error: {self.format_message()}", err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="shapeguard")
def cli() -> None:
    """Catch shape bugs in PyTorch attention code, and explain PyTorch's shape errors.

    \b
      shapeguard trace model.py              every attention tensor's shape, and any violation
      shapeguard trace model.py --device meta   the same with no memory (any model size)
      shapeguard check model.py              trace plus the semantic probes, as a summary
      shapeguard explain "RuntimeError: ..."  a PyTorch error message in attention terms

    Exit status: 0 clean, 1 violations found or the model crashed, 2 usage or loading error.
    """


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (`shapeguard`, `python -m shapeguard`)."""
    cli.main(args=argv, prog_name="shapeguard")


# -- options shared by trace and check -------------------------------------------------------


def _target_options(command):
    options = [
        click.argument("file", type=click.Path(dir_okay=True, path_type=str)),
        click.option(
            "--model",
            "model_name",
            metavar="NAME",
            help="The model to use: a class, a factory function or a module-level instance "
            "in FILE. Default: `model`, else `build_model()`, else the one nn.Module "
            "class defined in FILE.",
        ),
        click.option(
            "--arg",
            "arg_items",
            multiple=True,
            metavar="NAME=VALUE",
            help="Constructor keyword argument, as a Python literal (repeatable): --arg n_heads=6.",
        ),
        click.option(
            "--input",
            "input_items",
            multiple=True,
            metavar="NAME=[DTYPE:]SIZES",
            help="An input tensor for forward (repeatable): --input x=2,16,512 "
            "--input mask=bool:2,1,16,16. Overrides example_inputs() for that name.",
        ),
        click.option(
            "--dim",
            "dim_items",
            multiple=True,
            metavar="NAME=SIZE",
            help="Size of a named dim for inputs made from annotations or the "
            "[batch, seq, d_model] convention (repeatable): --dim seq=128.",
        ),
        click.option(
            "--device",
            type=click.Choice(["cpu", "meta"]),
            default="cpu",
            show_default=True,
            help="meta: build the model and its inputs on the meta device (no memory; "
            "shape errors are still caught).",
        ),
        click.option(
            "--json",
            "json_path",
            metavar="FILE",
            help="Write the trace as JSON (schema in docs/json-schema.md); '-' for stdout "
            "instead of the table.",
        ),
        click.option(
            "--html", "html_path", metavar="FILE", help="Write a self-contained HTML report."
        ),
        click.option(
            "--strict",
            is_flag=True,
            help="Stop at the first warning as at an error (any finding exits 1 either way).",
        ),
        click.option(
            "--traceback",
            "show_traceback",
            is_flag=True,
            help="Show the Python traceback of a failure on stderr.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


class _Target:
    """What trace and check share: the options, parsed, and the steps up to a traced forward."""

    def __init__(
        self,
        file,
        model_name,
        arg_items,
        input_items,
        dim_items,
        device,
        show_traceback,
        json_path=None,
        html_path=None,
    ):
        from . import _inputs, _loader

        self.file = file
        self.model_name = model_name
        self.device = device
        self.show_traceback = show_traceback
        self.json_path = json_path
        self.html_path = html_path
        with self.translate():
            self.kwargs = _loader.parse_assignments(arg_items, "--arg")
            self.specs = _inputs.parse_input_specs(input_items)
            self.dims = _inputs.parse_dims(dim_items)

    @contextlib.contextmanager
    def translate(self):
        """Turn library exceptions into the CLI's exit statuses (ShapeError: the report on stdout)."""
        from ._errors import ShapeError

        try:
            yield
        except LoadError as error:
            raise UsageFailure(str(error), error, self.show_traceback) from None
        except ShapeError as error:
            self._report_early(error.kind, error.render(), error.location, error.hint)
            raise Failed(
                f"{error.kind} violation in {self.file}", error, self.show_traceback
            ) from None
        except ModelCrashed as error:
            self._report_early("model_crashed", error.message, error.location, "")
            raise Failed(
                f"the model crashed: {error.phase}", error.__cause__ or error, self.show_traceback
            ) from None

    def _report_early(self, kind: str, message: str, location: str, hint: str) -> None:
        """A failure before any forward ran (importing or building the model): the message on
        stdout, and a trace holding only that finding for --json and --html."""
        from ._errors import Finding
        from ._record import Trace

        trace = Trace()
        trace.findings.append(
            Finding(
                kind=kind,
                severity="error",
                message=message,
                location=location,
                hint=hint,
                event_index=0,
            )
        )
        _write_outputs(trace, self.json_path, self.html_path)
        click.echo(trace.to_json() if self.json_path == "-" else f"error: {message}")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


@contextlib.contextmanager
def _status(message: str):
    """A spinner on stderr while loading, only on a terminal."""
    console = _console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(message):
        yield


@contextlib.contextmanager
def _module_progress(model, description: str):
    """A progress bar over the model's modules during the forward, only on a terminal."""
    console = _console(stderr=True)
    total = sum(1 for _ in model.modules())
    if not console.is_terminal or total < 8:
        yield
        return
    import torch
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    seen: set[int] = set()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)

        def advance(module, args):
            if id(module) not in seen:
                seen.add(id(module))
                progress.advance(task)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(advance)
        try:
            yield
        finally:
            handle.remove()


def _load_and_run(target: _Target, module, *, strict: bool = False):
    """Pick the model, make its inputs and run one traced forward.

    Warnings raised on the way (a deprecation in the user's code, a fallback
    notice) are diagnostics: collected and printed on stderr, once each.
    """
    import warnings

    from . import _inputs, _loader

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            with _status(f"building the model from {target.file}"):
                picked = _loader.pick_model(
                    module, name=target.model_name, kwargs=target.kwargs, device=target.device
                )
                inputs = _inputs.make_inputs(
                    module, picked.model, specs=target.specs, dims=target.dims, device=target.device
                )
        finally:
            _emit_warnings(caught)
    with _module_progress(picked.model, "tracing"):
        run = _loader.run_traced(
            picked.model,
            inputs.args,
            inputs.kwargs,
            strict=strict,
            path=picked.path,
            device=target.device,
        )
    _emit_warnings(run.warnings)
    return picked, inputs, run


def _describe(picked, inputs) -> str:
    model = type(picked.model).__name__
    args = ", ".join(f"{k}={v!r}" for k, v in picked.kwargs.items())
    how = picked.how if picked.how == model else f"{model} from {picked.how}"
    import inspect

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


def _write_outputs(trace, json_path: str | None, html_path: str | None) -> None:
    if json_path and json_path != "-":
        _write(json_path, trace.to_json())
    if html_path:
        try:
            html = trace.to_html()
        except ImportError as error:
            raise UsageFailure(f"--html is not available in this version ({error})") from None
        _write(html_path, html)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        raise UsageFailure(f"cannot write {path}: {error.strerror}") from None


def _emit_warnings(caught) -> None:
    from ._errors import ShapeWarning

    for w in caught:
        if not issubclass(w.category, ShapeWarning):  # those are findings, in the report
            click.echo(
                f"warning: {w.category.__name__}: {str(w.message).splitlines()[0]}", err=True
            )


def _table_width(console) -> int:
    return console.width if console.is_terminal else 150


def _empty_trace():
    from ._record import Trace

    return Trace()


# -- trace -----------------------------------------------------------------------------------


@cli.command()
@_target_options
@click.option("--all-ops", is_flag=True, help="Show every op, not only the attention tensors.")
@click.option(
    "--no-fold",
    is_flag=True,
    help="Show every row, also those that repeat an earlier layer's op and shapes.",
)
def trace(
    file,
    model_name,
    arg_items,
    input_items,
    dim_items,
    device,
    json_path,
    html_path,
    strict,
    show_traceback,
    all_ops,
    no_fold,
):
    """Run one forward of the model in FILE and show every attention tensor's shape.

    Inputs come from --input, else FILE's example_inputs(), else the forward's
    jaxtyping annotations, else [batch, seq, d_model] with d_model read from the model.
    """
    from . import _loader

    target = _Target(
        file,
        model_name,
        arg_items,
        input_items,
        dim_items,
        device,
        show_traceback,
        json_path,
        html_path,
    )
    with target.translate(), _loader.loaded(file) as module:
        picked, inputs, run = _load_and_run(target, module, strict=strict)
    trace = run.trace
    if run.crash is not None:
        _add_crash(trace, run.crash)
    _write_outputs(trace, json_path, html_path)
    if json_path == "-":
        click.echo(trace.to_json())
    else:
        click.echo(_describe(picked, inputs))
        click.echo(_report(trace, all_ops=all_ops, fold=not no_fold), nl=False)
    if run.crash is not None:
        raise Failed(f"the model crashed in {run.crash.phase}", run.crash.__cause__, show_traceback)
    if trace.findings:
        raise Failed(_count_text(trace) + f" in {file}", run.shape_error, show_traceback)


def _count_text(trace) -> str:
    parts = [(len(trace.errors), "error"), (len(trace.warnings), "warning")]
    return ", ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in parts if n)


def _report(trace, *, all_ops: bool = False, fold: bool = True) -> str:
    """The trace table and its findings; with no op recorded, the findings alone.

    Unfolded, this is `trace.table()`. Folded (the default), a row that repeats an
    earlier row in another layer (`blocks.7.attn` for `blocks.0.attn`: same op,
    tensor, shape, dtype and source line) is left out, so an 80-layer model reads
    as one layer plus the layers that differ; rows with a finding are always shown.
    """
    console = _console()
    width, color = _table_width(console), console.is_terminal
    if not trace.events:
        lines = [_summary_line(trace)]
        lines += [f"{f.severity}: {f.message}" for f in trace.findings]
        return "\n".join(lines) + "\n"
    from .report.text import attention_rows

    rows = attention_rows(trace, all_ops=all_ops)
    kept, folded = (
        fold_rows(rows, {str(f.event_index) for f in trace.findings}) if fold else (rows, 0)
    )
    if not folded:
        return trace.table(width=width, color=color, all_ops=all_ops)
    return _render_rows(trace, kept, folded, width=width, color=color)


_LAYER_INDEX = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def fold_rows(rows, keep: set[str]) -> tuple[list, int]:
    """Leave out rows that repeat an earlier row in another layer; return (kept, folded count).

    A row is `(index, module, op, tensor, shape, dtype, bytes, line)` as
    `report.text.attention_rows` makes it; the layer index is any all-digit part of
    the module path.
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


def _summary_line(trace) -> str:
    return (
        f"{len(trace.events)} ops in {trace.modules_seen} modules; "
        f"{len(trace.errors)} errors, {len(trace.warnings)} warnings"
    )


def _render_rows(trace, rows, folded: int, *, width: int, color: bool) -> str:
    """The folded table, in the columns of `report.text.render_table`."""
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="shapeguard trace", title_justify="left")
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
        table.add_column(
            header,
            style=style if color else None,
            overflow="fold" if wrap else "ellipsis",
            no_wrap=not wrap,
        )
    for row in rows:
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
    repeat = (
        "rows not shown: they repeat rows" if folded != 1 else "row not shown: it repeats a row"
    )
    console.print(
        f"{folded} {repeat} above in another layer, with the same op and shapes "
        "(--no-fold shows them)",
        highlight=False,
        markup=False,
    )
    console.print(_summary_line(trace), highlight=False, markup=False)
    for finding in trace.findings:
        console.print(f"{finding.severity}: {finding.message}", highlight=False, markup=False)
    return buffer.getvalue().rstrip() + "\n"


def _add_crash(trace, crash: ModelCrashed) -> None:
    """The crash as a finding, so the table, the JSON and the HTML report show it."""
    from ._errors import Finding

    trace.findings.append(
        Finding(
            kind="model_crashed",
            severity="error",
            message=crash.message,
            op=crash.phase,
            location=crash.location,
            hint="an error in the model's own code, not a shape rule",
            event_index=len(trace.events),
        )
    )


# -- check -----------------------------------------------------------------------------------


def probe_runner():
    """The semantic probes as `f(model, args, kwargs)`, or None when not installed.

    Prefers `shapeguard._check.run_check(model, args: tuple, kwargs: dict)`; falls back
    to a `check(model, *args, **kwargs)` in `shapeguard._check` or `shapeguard._probes`.
    """
    import importlib

    for module_name in ("_check", "_probes"):
        full = f"{__package__}.{module_name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as error:
            if error.name == full:
                continue
            raise
        run_check = getattr(module, "run_check", None)
        if callable(run_check):
            return lambda model, args, kwargs: run_check(model, args, kwargs)
        check_fn = getattr(module, "check", None)
        if callable(check_fn):
            return lambda model, args, kwargs: check_fn(model, *args, **kwargs)
    return None


def probe_rows(result) -> list[tuple[str, str, str]]:
    """(name, status, message) for each probe in whatever the probe runner returned.

    Accepts an object with `.results` (or `.probes`, `.findings`), or an iterable of
    items with `name`, a status (`passed` / `ok` bool, or `status` string, or a
    `severity`), and `message`; dicts with the same keys work too.
    """
    items = result
    for attr in ("results", "probes", "findings"):
        if hasattr(result, attr):
            items = getattr(result, attr)
            break
    if items is None:
        return []
    if isinstance(items, dict):
        items = list(items.values())
    if not isinstance(items, list | tuple):
        try:
            items = list(items)
        except TypeError:
            items = [items]
    rows = []
    for item in items:
        get = item.get if isinstance(item, dict) else (lambda k, d=None, _i=item: getattr(_i, k, d))
        name = get("name") or get("probe") or get("kind") or type(item).__name__
        status = get("status")
        if status is None:
            passed = get("passed", get("ok"))
            if passed is None:
                passed = get("severity", "error") != "error"
            status = "pass" if passed else "FAIL"
        status = {
            "passed": "pass",
            "ok": "pass",
            "failed": "FAIL",
            "fail": "FAIL",
            "skipped": "skip",
            "error": "FAIL",
        }.get(str(status).lower(), str(status))
        message = get("message") or get("detail") or ""
        rows.append((str(name), status, str(message)))
    return rows


@cli.command()
@_target_options
def check(
    file,
    model_name,
    arg_items,
    input_items,
    dim_items,
    device,
    json_path,
    html_path,
    strict,
    show_traceback,
):
    """Trace the model in FILE, run the semantic probes, and summarize pass / fail.

    The probes (batch independence, causality, ...) need real values, so they are
    skipped on --device meta. Exit status 1 on any failure.
    """
    from . import _loader

    target = _Target(
        file,
        model_name,
        arg_items,
        input_items,
        dim_items,
        device,
        show_traceback,
        json_path,
        html_path,
    )
    with target.translate(), _loader.loaded(file) as module:
        picked, inputs, run = _load_and_run(target, module, strict=strict)
        trace = run.trace
        if run.crash is not None:
            _add_crash(trace, run.crash)
        rows = [_trace_row(trace)]
        rows += [(f.kind, "FAIL", f.message.splitlines()[0]) for f in trace.findings]
        details = [f.message for f in trace.findings]
        rows_probes, probe_details = _run_probes(picked.model, inputs, run, device)
        rows += rows_probes
        details += probe_details
    _write_outputs(trace, json_path, html_path)
    if json_path == "-":
        click.echo(trace.to_json())
    else:
        click.echo(_describe(picked, inputs))
        click.echo(_summary_table(rows, _console()), nl=False)
        for detail in details:
            click.echo(f"\n{detail}")
    failures = sum(1 for _, status, _ in rows if status == "FAIL")
    if failures:
        raise Failed(
            f"{failures} check{'s' if failures != 1 else ''} failed in {file}",
            run.shape_error or (run.crash.__cause__ if run.crash else None),
            show_traceback,
        )


def _trace_row(trace) -> tuple[str, str, str]:
    status = "FAIL" if trace.findings else "pass"
    return (
        "trace",
        status,
        f"{len(trace.events)} ops in {trace.modules_seen} modules; "
        f"{len(trace.errors)} errors, {len(trace.warnings)} warnings",
    )


def _run_probes(model, inputs, run, device: str) -> tuple[list, list[str]]:
    from ._errors import ShapeError

    if device == "meta":
        return [
            ("semantic probes", "skip", "probes compare real values; run without --device meta")
        ], []
    if run.failed:
        return [("semantic probes", "skip", "the trace failed; fix that first")], []
    runner = probe_runner()
    if runner is None:
        return [("semantic probes", "skip", "not available in this version of shapeguard")], []
    try:
        with _module_progress(model, "probing"):
            result = runner(model, inputs.args, inputs.kwargs)
    except ShapeError as error:
        return [(error.kind, "FAIL", error.relation)], [error.render()]
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        return [("semantic probes", "FAIL", f"raised {type(error).__name__}: {first}")], []
    # The probes' own "shape checks" row repeats the trace row above.
    rows = [row for row in probe_rows(result) if row[0] != "shape checks"]
    details = [message for _, status, message in rows if status == "FAIL" and "\n" in message]
    rows = [
        (name, status, message.splitlines()[0] if message else "") for name, status, message in rows
    ]
    return rows, details


def _summary_table(rows, console) -> str:
    import io

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    color = console.is_terminal
    table = Table(title="shapeguard check", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("detail", overflow="fold")
    styles = {"pass": "green", "FAIL": "bold red", "warn": "yellow", "skip": "dim"}
    for name, status, detail in rows:
        table.add_row(
            Text(name), Text(status, style=styles.get(status, "") if color else ""), Text(detail)
        )
    buffer = io.StringIO()
    out = Console(
        file=buffer,
        width=_table_width(console),
        force_terminal=color,
        color_system="auto" if color else None,
        no_color=not color,
    )
    out.print(table)
    return buffer.getvalue()


# -- explain ---------------------------------------------------------------------------------


@cli.command()
@click.argument("text", required=False)
def explain(text: str | None) -> None:
    """Explain a PyTorch shape error (or flash-attn's) in attention terms.

    TEXT is the error message or a whole traceback; without it, it is read from stdin:

    \b
      shapeguard explain "mat1 and mat2 shapes cannot be multiplied (64x128 and 256x64)"
      python train.py 2>&1 | shapeguard explain
    """
    from ._explain import explain as explain_text

    if text is None:
        stdin = sys.stdin
        if stdin is None or stdin.isatty():
            raise UsageFailure(
                "give the error message as an argument, or pipe it in: "
                "python train.py 2>&1 | shapeguard explain"
            )
        text = stdin.read()
    if not text.strip():
        raise UsageFailure("the error text is empty; paste the message torch printed")
    found = explain_text(text)
    if not found:
        first = next((line.strip() for line in text.strip().splitlines()[::-1] if line.strip()), "")
        click.echo(f"shapeguard has no explanation for this message: {first[:200]}")
        raise Failed("no known error message found in the text")
    click.echo("\n\n".join(e.render() for e in found))
