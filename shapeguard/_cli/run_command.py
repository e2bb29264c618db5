"""`shapeguard run script.py [args]`: the user's own program, with its attention traced on the
inputs it really passes (`run_program` runs it, `run_watch` picks the forwards to trace).

The program's output and exit status are its own; the report goes to stderr (or `--json`,
`--html`, `--format github`). Exit status: the program's, except that with `--strict` any
finding makes it 1; a program stopped by `--steps` ends with 0; Ctrl-C 130 (the report of
what was traced still printed); 2 when the script or module cannot be found.
"""

import json
import sys

import click

from .errors import Failed, UsageFailure

_SCHEMA = "shapeguard.run"
_SCHEMA_VERSION = 1


def _positive(ctx, param, value):
    if value is not None and value < 1:
        raise click.BadParameter("must be 1 or more")
    return value


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "-m",
    "module_name",
    metavar="MODULE",
    help="Run a module as `python -m MODULE` does; every argument after it is the module's.",
)
@click.option(
    "--module",
    "watch_names",
    multiple=True,
    metavar="NAME",
    help="Trace the modules of this class (its name or module.QualName; repeatable). "
    "Default: each outermost module whose first forward reaches attention.",
)
@click.option(
    "--calls",
    type=int,
    default=1,
    show_default=True,
    callback=_positive,
    help="Calls traced per module and input signature (shapes and dtypes); "
    "the others run with no trace open.",
)
@click.option(
    "--steps",
    type=int,
    default=None,
    callback=_positive,
    help="Stop the program after N training steps (a backward or optimizer.step after a "
    "watched forward); the report still prints and the exit status is 0.",
)
@click.option(
    "--json",
    "json_path",
    metavar="FILE",
    help="Write the report as JSON; '-' for stdout (the program's own stdout then goes to stderr).",
)
@click.option("--html", "html_path", metavar="FILE", help="Write a self-contained HTML report.")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "github"]),
    default="text",
    show_default=True,
    help="github: one ::error / ::warning line per finding on stdout, after the program's output.",
)
@click.option(
    "--check",
    "probes",
    is_flag=True,
    help="After the program, run check's semantic probes on each traced module with the "
    "inputs of its first traced call (copied, at most 64 MiB; dropped after), in eval mode.",
)
@click.option(
    "--keep-inputs",
    "keep_dir",
    metavar="DIR",
    help="Save the first traced call's inputs of each traced module into DIR (its first 4 "
    "examples where the batch axis is known; plain data only), for "
    "`shapeguard check FILE --from-run DIR`.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 on any finding or failed check, whatever the program's status.",
)
@click.argument("program", nargs=-1, type=click.UNPROCESSED)
def run_command(
    module_name,
    watch_names,
    calls,
    steps,
    json_path,
    html_path,
    output_format,
    probes,
    keep_dir,
    strict,
    program,
):
    """Run a Python program as `python SCRIPT [ARGS]` would, tracing the forwards of its
    attention modules on the inputs it really passes.

    \b
      shapeguard run train.py --lr 3e-4       the script gets --lr 3e-4 in its sys.argv
      shapeguard run -m mypkg.train --steps 2
      shapeguard run --module CausalSelfAttention train.py

    shapeguard's options come before SCRIPT; everything after SCRIPT is the script's own.
    """
    if module_name is None and not program:
        raise UsageFailure("give the script to run (shapeguard run train.py), or -m MODULE")
    path, args = (None, program) if module_name is not None else (program[0], program[1:])
    from .run_program import ProgramNotFound, run_program
    from .run_watch import Watcher
    from .target import quiet_torch

    if keep_dir is not None:
        from .kept_inputs import prepare_dir

        prepare_dir(keep_dir)
    quiet_torch()
    keep = probes or keep_dir is not None
    watcher = Watcher(names=tuple(watch_names), calls=calls, steps=steps, keep_inputs=keep)
    with _stdout_for(json_path) as held:
        watcher.install()
        try:
            ended = run_program(path, module_name, args)
        except ProgramNotFound as error:
            raise UsageFailure(str(error)) from None
        finally:
            watcher.remove()
        sys.stdout.flush()
        if keep_dir is not None:
            _keep(watcher, keep_dir, path, module_name, args)
        if probes:
            _check(watcher, ended)
        for watched in watcher.watched:
            watched.module = watched.sample = None  # no tensor outlives the command
        _report(watcher, ended, json_path, html_path, output_format, held, path or module_name)
    findings = sum(len(w.trace.findings) for w in watcher.watched)
    failed = sum(w.check.failures for w in watcher.watched if w.check is not None)
    if strict and (findings or failed):
        parts = [(findings, "finding"), (failed, "failed check")]
        raise Failed(", ".join(_count(n, word) for n, word in parts if n) + " (--strict)")
    if ended.status:
        raise click.exceptions.Exit(ended.status)


def _keep(watcher, folder: str, path, module_name, args) -> None:
    """`--keep-inputs`: the kept inputs written into `folder`, a line on stderr saying so."""
    import os

    from .kept_inputs import save

    program = {
        "program": os.path.abspath(path) if path is not None else None,
        "module_program": module_name,
        "argv": list(args),
        "cwd": os.getcwd(),
    }
    try:
        notes = save(folder, watcher.watched, program)
    except OSError as error:  # after the program ran: its report still comes, this line first
        click.echo(f"shapeguard run: cannot write the kept inputs into {folder}: {error}", err=True)
        return
    kept = len(watcher.watched) - len(notes)
    for note in notes:
        click.echo(f"shapeguard run: {note}", err=True)
    click.echo(
        f"shapeguard run: kept the inputs of {_count(kept, 'module')} in {folder} "
        f"(shapeguard check FILE --from-run {folder})",
        err=True,
    )


def _check(watcher, ended) -> None:
    """The probes on each traced module (none after Ctrl-C); the copied inputs dropped."""
    from .check_summary import Summary
    from .run_check import check_module

    for watched in watcher.watched:
        if ended.interrupted:
            watched.check = Summary([("semantic probes", "skip", "interrupted (Ctrl-C)")])
        else:
            watched.check = check_module(watched.module, watched.sample, watched.trace)


class _Held:
    """`--json -`'s JSON, written to the real stdout once the program's output is moved back."""

    def __init__(self) -> None:
        self.text: str | None = None


def _stdout_for(json_path):
    import contextlib

    @contextlib.contextmanager
    def block():
        held = _Held()
        if json_path != "-":
            yield held
            return
        from .json_stdout import stdout_to_stderr

        try:
            with stdout_to_stderr():
                yield held
        finally:
            if held.text is not None:
                click.echo(held.text)

    return block()


def _report(watcher, ended, json_path, html_path, output_format, held, program) -> None:
    from .. import _suppress

    for watched in watcher.watched:
        _suppress.apply(watched.trace)
    if json_path:
        text = json.dumps(run_dict(watcher, ended, program), indent=2)
        if json_path == "-":
            held.text = text
        else:
            from .target import write_report

            write_report(json_path, text)
    if html_path:
        _write_html(watcher, html_path)
    if output_format == "github":
        from ..report.text import render_github

        click.echo("".join(render_github(w.trace) for w in watcher.watched), nl=False)
    elif json_path != "-":
        click.echo(render_run(watcher, ended, program), nl=False, err=True)


def render_run(watcher, ended, program: str) -> str:
    """The text report: per traced module, its table and findings; then one closing line."""
    from ..report.text import render_check, render_findings, render_table

    parts = []
    for watched in watcher.watched:
        trace = watched.trace
        parts.append(f"shapeguard run: {watched.name}: {_calls_text(watched)}\n")
        parts.append(render_table(trace, width=None, fold=True) if trace.events else "")
        if not trace.events:
            parts.append(render_findings(trace))
        summary = watched.check
        if summary is not None:
            parts.append(render_check(summary.rows, width=None))
            parts.extend(f"\n{detail}\n" for detail in summary.details)
            parts.append(f"{summary.line()}\n")
    findings = sum(len(w.trace.findings) for w in watcher.watched)
    end = (
        f"stopped after {watcher.steps_done} step{'s' if watcher.steps_done != 1 else ''} (--steps)"
        if ended.stopped
        else "interrupted"
        if ended.interrupted
        else f"exit status {ended.status}"
    )
    if watcher.compiled:
        parts.append(
            f"shapeguard run: not traced, compiled with torch.compile: {', '.join(watcher.compiled)} "
            "(run without torch.compile to trace it)\n"
        )
    if not watcher.watched:
        parts.append(
            f"shapeguard run: {program} ran no module with attention "
            "(name one with --module NAME to trace it anyway)\n"
        )
    parts.append(
        f"shapeguard run: {program}: {_count(len(watcher.watched), 'module')} traced, "
        f"{_count(findings, 'finding')}; {end}\n"
    )
    return "".join(parts)


def _calls_text(watched) -> str:
    signatures = len(watched.signatures)
    return (
        f"{_count(watched.traced, 'call')} traced of {watched.calls}, "
        f"{_count(signatures, 'input signature')}"
    )


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def run_dict(watcher, ended, program: str) -> dict:
    """The JSON report: the program's end and, per traced module, its trace (the trace
    schema of docs/json-schema.md)."""
    from .._version import __version__

    return {
        "schema": _SCHEMA,
        "schema_version": _SCHEMA_VERSION,
        "shapeguard_version": __version__,
        "program": program,
        "exit_status": ended.status,
        "interrupted": ended.interrupted,
        "stopped": ended.stopped,
        "steps": watcher.steps_done,
        "modules": [
            {
                "module": w.name,
                "calls": w.calls,
                "calls_traced": w.traced,
                "signatures": len(w.signatures),
                "trace": w.trace.to_dict(),
                "check": w.check.to_dict() if w.check is not None else None,
            }
            for w in watcher.watched
        ],
    }


def _write_html(watcher, path: str) -> None:
    """One page per traced module: the first at `path`, the next at `path` with `.2`, `.3`
    ... before its suffix."""
    import os

    from ..report.html import render_html
    from .target import write_report

    stem, suffix = os.path.splitext(path)
    for i, watched in enumerate(watcher.watched):
        target = path if i == 0 else f"{stem}.{i + 1}{suffix}"
        write_report(
            target, render_html(watched.trace, None, title=f"shapeguard run: {watched.name}")
        )
