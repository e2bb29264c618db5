"""The `shapeguard` command: trace, check and explain.

A thin click group over library functions (`_loader`, `_inputs`, `_run`,
`_check_summary`, `_explain`, `report.text`). Exit statuses are carried by exception
classes (`_cli_errors`): 0 clean, 1 violations found or the model crashed, 2 a usage
or loading error. The report goes to stdout, diagnostics (a spinner, a progress bar,
warnings) to stderr. torch is imported only by the commands that need it.
"""

import contextlib
import sys

import click

from ._check_summary import probe_rows as probe_rows
from ._check_summary import probe_runner as probe_runner
from ._cli_errors import Failed, UsageFailure
from ._cli_target import target_options
from ._version import __version__


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


# -- trace -----------------------------------------------------------------------------------


@cli.command()
@target_options
@click.option("--all-ops", is_flag=True, help="Show every op, not only the attention tensors.")
@click.option(
    "--no-fold",
    is_flag=True,
    help="Show every row, also those that repeat an earlier layer's op and shapes.",
)
def trace(target, all_ops, no_fold):
    """Run one forward of the model in FILE and show every attention tensor's shape.

    Inputs come from --input, else FILE's example_inputs(), else the forward's
    jaxtyping annotations, else [batch, seq, d_model] with d_model read from the model.
    """
    from .report.text import render_findings, render_target

    with target.loaded() as module:
        picked, inputs, run = _load_and_run(target, module)
    trace = run.trace
    width, color = _stdout_style()
    target.report(
        trace,
        render_target(picked, inputs),
        # No op recorded (the forward failed at once): no table, the findings alone.
        lambda: (
            trace.table(width=width, color=color, all_ops=all_ops, fold=not no_fold)
            if trace.events
            else render_findings(trace)
        ),
    )
    if run.crash is not None:
        raise Failed(
            f"the model crashed in {run.crash.phase}", run.crash.__cause__, target.show_traceback
        )
    if trace.findings:
        raise Failed(
            _count_text(trace) + f" in {target.file}", run.shape_error, target.show_traceback
        )


def _count_text(trace) -> str:
    parts = [(len(trace.errors), "error"), (len(trace.warnings), "warning")]
    return ", ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in parts if n)


# -- check -----------------------------------------------------------------------------------


@cli.command()
@target_options
def check(target):
    """Trace the model in FILE, run the semantic probes, and summarize pass / fail.

    The probes (batch independence, causality, ...) need real values, so they are
    skipped on --device meta. Exit status 1 on any failure.
    """
    from ._check_summary import summary_rows
    from .report.text import render_check, render_target

    with target.loaded() as module:
        picked, inputs, run = _load_and_run(target, module)
        rows, details = summary_rows(
            picked.model,
            inputs,
            run,
            target.device,
            find_runner=probe_runner,
            progress=_module_progress,
        )
    width, color = _stdout_style()
    target.report(
        run.trace,
        render_target(picked, inputs),
        lambda: render_check(rows, width=width, color=color) + "".join(f"\n{d}\n" for d in details),
    )
    failures = sum(1 for _, status, _ in rows if status == "FAIL")
    if failures:
        raise Failed(
            f"{failures} check{'s' if failures != 1 else ''} failed in {target.file}",
            run.shape_error or (run.crash.__cause__ if run.crash else None),
            target.show_traceback,
        )


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


# -- running the model, with a spinner and a progress bar on a terminal -------------------------


def _load_and_run(target, module):
    """Build the model in `module` and its inputs, and run one traced forward:
    (picked, inputs, run), the crash (if any) recorded as the trace's last finding.

    Warnings raised on the way (a deprecation in the user's code, a fallback notice)
    are diagnostics: printed on stderr, once each. Not a context manager: a message
    about the forward names the innermost frame outside shapeguard and torch, and that
    must not be contextlib's `__enter__`.
    """
    import warnings

    from . import _inputs, _loader
    from ._run import add_crash, run_traced

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
        run = run_traced(
            picked.model,
            inputs.args,
            inputs.kwargs,
            strict=target.strict,
            path=picked.path,
            device=target.device,
        )
    _emit_warnings(run.warnings)
    if run.crash is not None:
        add_crash(run.trace, run.crash)
    return picked, inputs, run


def _emit_warnings(caught) -> None:
    from ._errors import ShapeWarning

    for w in caught:
        if not issubclass(w.category, ShapeWarning):  # those are findings, in the report
            click.echo(
                f"warning: {w.category.__name__}: {str(w.message).splitlines()[0]}", err=True
            )


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _stdout_style() -> tuple[int, bool]:
    """(width, color) for the report: the terminal's, or 150 columns of plain text."""
    console = _console()
    return (console.width if console.is_terminal else 150), console.is_terminal


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
