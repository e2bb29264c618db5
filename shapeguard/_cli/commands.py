"""The `shapeguard` command: trace, check and explain.

A thin click group over library functions (`_cli.loader`, `_cli.inputs`, `_cli.run`,
`_cli.check_summary`, `_explain.explain`, `report.text`). Exit statuses are carried by exception
classes (`_cli.errors`): 0 clean, 1 violations found or the model crashed, 2 a usage
or loading error, 130 interrupted. The report goes to stdout, diagnostics (a spinner, a progress bar,
warnings) to stderr. torch is imported only by the commands that need it.
"""

import contextlib
import functools
import os
import sys
from collections.abc import Mapping

import click

from .._version import __version__
from .check_summary import probe_runner as probe_runner
from .errors import Failed, Interrupted, UsageFailure
from .kept_from_run import from_run_options, kept_crash_hint
from .run_command import run_command
from .target import target_options


class _Group(click.Group):
    """The command group; Ctrl-C is `Interrupted` (exit 130), not click's `Aborted!` (1)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted() from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="shapeguard")
def cli() -> None:
    """Catch shape bugs in PyTorch attention code, and explain PyTorch's shape errors.

    \b
      shapeguard run train.py [ARGS]         your own program, its attention traced on its inputs
      shapeguard trace model.py              every attention tensor's shape, and any violation
      shapeguard trace model.py --device meta   the same with no memory (any model size)
      shapeguard trace -m mypkg.model        a module of a package (relative imports work)
      shapeguard trace train.py -- --lr 0.1  the file's own sys.argv after --
      shapeguard check model.py              trace plus the semantic probes, as a summary
      shapeguard explain "RuntimeError: ..."  a PyTorch error message in attention terms

    Exit status: 0 clean, 1 violations found or the model crashed, 2 usage or loading error,
    130 interrupted.
    """


cli.add_command(run_command)


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
@click.option(
    "--tp",
    "tp_degrees",
    metavar="N[,N...]",
    help="Simulate N tensor-parallel ranks (no real ranks: one subprocess per rank whose "
    "shards differ, on torch's fake process group), with the file's parallelize(model, "
    "mesh), its tp_plan dict, or q/k/v colwise and the output projection rowwise; "
    "--tp 1,2,4,8 sweeps the degrees and names those that work.",
)
@click.option(
    "--reach",
    "reach_layer",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[LAYER]",
    callback=lambda ctx, param, value: _reach_layer(value),
    help="Instead of the table, draw which keys each query sees at the attention sites of "
    "LAYER (a module path, a glob or a substring of one; every site without it), per example "
    "and head where they differ. Put it after FILE, or write --reach=LAYER.",
)
def trace(target, all_ops, no_fold, tp_degrees, reach_layer):
    """Run one forward of the model in FILE and show every attention tensor's shape.

    Inputs come from --input, else FILE's example_inputs(), else the forward's
    jaxtyping annotations, else the model's structure (token ids for an Embedding,
    the width of the Linear an input feeds, masks with padding).

    Under torchrun each rank traces its own forward: lines are prefixed `[rank r/N]`,
    rank 0 prints the whole report and the others their findings; --json and --html
    paths get the rank (`{rank}` in the path, else `.rank<r>` before the suffix), and
    `shapeguard merge` makes one report of them.
    """
    if tp_degrees is not None:
        _simulate_tp(target, tp_degrees)
        return
    from .run import Freezer

    hold = Freezer()  # the collector frozen from the model's build until the report is out
    try:
        _trace_and_report(target, all_ops, no_fold, hold, reach_layer)
    finally:
        hold.close()


def _trace_and_report(target, all_ops: bool, no_fold: bool, hold, reach_layer=None) -> None:
    from ..report.text import render_findings, render_table, render_target

    with target.loaded() as module, contextlib.ExitStack() as stack:
        picked, inputs, run = _load_and_run(target, module, stack, hold)
        attention = _attention(target, picked, inputs, run)
    trace = run.trace
    width, color = _stdout_style()
    notes = _notes(target, picked, inputs)
    reach = _reach_text(trace, reach_layer)
    target.report(
        trace,
        render_target(picked, inputs, width),
        # No op recorded (the forward failed at once): no table, the findings alone.
        lambda: (
            reach + render_findings(trace, notes)
            if reach is not None
            else render_table(
                trace,
                width=width,
                color=color,
                all_ops=all_ops,
                fold=not no_fold,
                notes=notes,
                every_op="--all-ops",
            )
            if trace.events
            else render_findings(trace, notes)
        ),
        attention=attention,
    )
    if run.crash is not None:
        raise Failed(
            f"the model crashed in {run.crash.phase}", run.crash.__cause__, target.show_traceback
        )
    if trace.findings:
        raise Failed(
            _count_text(trace) + f" in {target.file}", run.shape_error, target.show_traceback
        )


def _reach_layer(value: str | None) -> str | None:
    """--reach's LAYER; a Python file there is FILE taken as the LAYER (`--reach model.py`:
    an option's optional value takes the next word), a usage error that says so."""
    if value and value.endswith(".py") and os.path.isfile(value):
        raise UsageFailure(
            f"--reach took {value} as its LAYER: put --reach after FILE "
            f"(shapeguard trace {value} --reach), or write --reach=LAYER"
        )
    return value


def _reach_text(trace, layer: str | None) -> str | None:
    """`--reach [LAYER]`'s matrices (None without the option); a LAYER that names no
    attention site is a usage error that lists the sites."""
    if layer is None:
        return None
    from ..report._reach_text import NoSuchSite, render_reach

    try:
        return render_reach(trace, layer or None) + "\n"
    except NoSuchSite as error:
        raise UsageFailure(str(error)) from None


def _simulate_tp(target, text: str) -> None:
    """`trace --tp`: each degree's simulated ranks, merged; the degrees that work."""
    from .. import _merge
    from . import tp as _cli_tp
    from .target import echo

    with target.translate():
        degrees = _cli_tp.parse_degrees(text)
    if target.json_path or target.html_path or target.format != "text":
        raise UsageFailure(
            "--tp prints a text report only; for JSON run the ranks (torchrun ... --json "
            "trace.json) and shapeguard merge them"
        )
    results = _cli_tp.simulate(target.argv, degrees)
    lines, working, failed = [], [], 0
    for tp, merged, failure in results:
        if merged is None:
            lines.append(f"tp={tp}: did not run: {failure}")
            failed += 1
            continue
        if not merged.groups:
            working.append(tp)
            if len(results) > 1:
                lines.append(f"tp={tp}: no finding")
            continue
        failed += 1
        body = _merge.render(merged).replace("shapeguard merge: ", f"tp={tp}: ", 1)
        lines.append(body.rstrip("\n"))
    if len(results) > 1:
        lines.append(
            f"of the tp degrees tried ({', '.join(map(str, degrees))}), these work: "
            f"{', '.join(map(str, working))}" if working else
            f"none of the tp degrees tried ({', '.join(map(str, degrees))}) works"
        )  # fmt: skip
    elif working:
        lines.append(f"tp={working[0]}: no finding on any rank (simulated)")
    echo("\n".join(lines) + "\n")
    if failed:
        raise Failed(
            f"{failed} of {len(results)} tp degree{'s' if len(results) != 1 else ''} failed "
            f"in {target.file}"
        )


# -- merge -----------------------------------------------------------------------------------


@cli.command()
@click.argument("reports", nargs=-1, required=True, type=click.Path(dir_okay=False))
def merge(reports):
    """One report from the --json reports of several ranks: findings grouped by the ranks
    that hit them, and the shapes that differ between ranks side by side.

    \b
      torchrun --nproc_per_node=2 -m shapeguard trace model.py --json trace.json
      shapeguard merge trace.rank*.json
    """
    from .. import _merge

    loaded = {}
    try:
        for i, path in enumerate(reports):
            report = _merge.load(path)
            rank = _merge.rank_of(report, i)
            if rank in loaded:
                raise _merge.MergeError(f"{path} is rank {rank}'s report, as is another given")
            loaded[rank] = report
    except _merge.MergeError as error:
        raise UsageFailure(str(error)) from None
    merged = _merge.merge(loaded)
    click.echo(_merge.render(merged, list(reports)), nl=False)
    if merged.groups:
        counts = [(merged.errors, "error"), (merged.warnings, "warning")]
        raise Failed(
            ", ".join(f"{n} {w}{'s' if n != 1 else ''}" for n, w in counts if n)
            + " across the ranks"
        )


def _count_text(trace) -> str:
    parts = [(len(trace.errors), "error"), (len(trace.warnings), "warning")]
    return ", ".join(f"{n} {word}{'s' if n != 1 else ''}" for n, word in parts if n)


def _notes(target, picked, inputs) -> tuple[str, ...]:
    """What the value checks had nothing to test with, for the report."""
    from . import inputs_structure as _inputs_structure

    lines = [picked.on_meta] if picked.on_meta else []
    if target.device == "meta" and not picked.on_meta:
        lines.append(
            "on --device meta there are no values: the checks that read a mask's values "
            "(polarity, direction, axis, empty rows) did not run"
        )
    else:
        params: Mapping[str, object]
        try:
            import inspect

            params = inspect.signature(picked.model.forward).parameters
        except (TypeError, ValueError):
            params = {}
        given = {*inputs.kwargs, *list(params)[: len(inputs.args)]}
        masks = [n for n in params if _inputs_structure.is_mask_name(n)]
        missing = [n for n in masks if n not in given]
        if missing and not any(n in given for n in masks):
            lines.append(
                f"no mask was passed as {', '.join(missing)}: the mask checks had nothing to "
                f"test; pass one with --input {missing[0]}=bool:SIZES (a mask is filled with "
                "padding) or in example_inputs()"
            )
    return tuple(lines)


def _attention(target, picked, inputs, run):
    """The attention weights for --html's heatmaps: one more forward on cpu (none on meta)."""
    if not target.html_path or target.device != "cpu" or run.crash is not None:
        return None
    from ..report.html import capture_attention

    try:
        return capture_attention(picked.model, *inputs.args, **inputs.kwargs)
    except Exception:
        return None


# -- check -----------------------------------------------------------------------------------


@cli.command()
@target_options
@from_run_options
def check(target, inputs_for):
    """Trace the model in FILE, run the semantic probes, and summarize pass / fail.

    The probes (batch independence, causality, ...) need real values, so they are
    skipped on --device meta. A probe that proves nothing either way is inconclusive,
    with its reason, and fails nothing. Exit status 1 on any failure.
    """
    from .run import Freezer

    hold = Freezer()  # the collector frozen from the model's build until the report is out
    try:
        _check_and_report(target, hold, inputs_for)
    finally:
        hold.close()


def _check_and_report(target, hold, inputs_for=None) -> None:
    from ..report.text import render_check, render_target
    from .check_summary import summary_rows

    with target.loaded() as module, contextlib.ExitStack() as stack:
        picked, inputs, run = _load_and_run(target, module, stack, hold, inputs_for)
        summary = summary_rows(
            picked.model,
            inputs,
            run,
            target.device,
            find_runner=probe_runner,
            progress=_probe_progress,
        )
        attention = _attention(target, picked, inputs, run)
    width, color = _stdout_style()
    target.report(
        run.trace,
        render_target(picked, inputs, width),
        lambda: (
            render_check(summary.rows, width=width, color=color)
            + summary.mode_text(width)
            + "".join(f"\n{d}\n" for d in summary.details)
            + f"{summary.line()}\n"
            + "".join(f"note: {note}\n" for note in _notes(target, picked, inputs))
        ),
        check=summary,
        attention=attention,
    )
    failures = summary.failures
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
    from .._explain.explain import explain as explain_text

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


def _load_and_run(target, module, stack, hold=None, inputs_for=None):
    """Build the model in `module` and its inputs (`inputs_for`'s if given), run one forward:
    (picked, inputs, run), the crash (if any) recorded as the trace's last finding.

    Warnings raised on the way (a deprecation in the user's code, a fallback notice)
    are diagnostics: printed on stderr, once each. Not a context manager: a message
    about the forward names the innermost frame outside shapeguard and torch, and that
    must not be contextlib's `__enter__`.
    """
    import warnings

    from . import inputs as _inputs
    from . import picking as _picking
    from . import tp as _cli_tp
    from .run import add_crash, run_traced

    if hold is not None:
        hold.freeze()  # torch and the file are loaded: out of the collector's sight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            with _status(f"building the model from {target.file}"):
                picked = _picking.pick_model(
                    module, name=target.model_name, kwargs=target.kwargs, device=target.device
                )
                if picked.on_meta:  # too large at its defaults: traced on meta, and said so
                    target.device = "meta"
                make = inputs_for or functools.partial(
                    _inputs.make_inputs, module, specs=target.specs, dims=target.dims
                )
                inputs = make(picked.model, device=target.device)
                # A rank of a tensor-parallel run (torchrun with a plan, or --tp's
                # simulated one): the plan applied, the process group held open.
                picked.model = stack.enter_context(_cli_tp.parallel(module, picked.model))
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
            site=picked.site,
            prepare=inputs.claim_layouts,
            hold=hold,
        )
    _emit_warnings(run.warnings)
    if run.memory:
        raise UsageFailure(
            f"the forward needs more memory than is free ({run.memory}); "
            "use --device meta to check shapes with no memory"
        )
    if inputs.reads is not None:  # a failure on an input shapeguard made up is not a bug
        from .inputs_blame import judge

        judge(run, inputs.reads)
    if run.crash is not None:
        from .malformed import malformed_contract

        malformed = malformed_contract(run.crash.error)
        if malformed is not None:
            raise malformed from run.crash.error
        if inputs.made and run.crash.generic:
            run.crash.hint = _made_up_hint(inputs)
        elif inputs_for is not None and run.crash.generic:
            run.crash.hint = kept_crash_hint(inputs)
        add_crash(run.trace, run.crash)
    return picked, inputs, run


def _made_up_hint(inputs) -> str:
    """The hint of a forward that crashed on inputs shapeguard made up."""
    made = ", ".join(f"{name}={text}" for name, text in inputs.made.items())
    first, text = next(iter(inputs.made.items()))
    shape, _, dtype = text.strip("[").partition("] ")
    example = (
        f"--input {first}={dtype}:{shape.replace(' ', '')}" if dtype else f"--input {first}=..."
    )
    return (
        f"shapeguard made up the inputs {made}; if the forward expects others, pass them with "
        f"--input (e.g. {example}) or add example_inputs() to the file"
    )


def _emit_warnings(caught) -> None:
    from .._errors import ShapeWarning, first_line

    for w in caught:
        if not issubclass(w.category, ShapeWarning):  # those are findings, in the report
            click.echo(f"warning: {w.category.__name__}: {first_line(w.message)}", err=True)


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=False)


def _stdout_style() -> tuple[int | None, bool]:
    """(width, color) for the report: the terminal's; piped, plain text as wide as
    `COLUMNS` says, else as wide as the table needs (None: nothing is cut)."""
    import os

    console = _console()
    if console.is_terminal:
        return console.width, True
    columns = os.environ.get("COLUMNS", "").strip()
    return (int(columns) if columns.isdigit() and int(columns) > 0 else None), False


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
def _probe_progress(model):
    """While the probes run (many forwards, how many depends on the model): a bar with no
    total, the forwards counted and the time elapsed, only on a terminal."""
    console = _console(stderr=True)
    if not console.is_terminal:
        yield
        return
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("probing"),
        BarColumn(),
        TextColumn("{task.completed} forwards"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("probing", total=None)
        root = type(model)

        def advance(module, args):
            if type(module) is root:
                progress.advance(task)

        handle = torch.nn.modules.module.register_module_forward_pre_hook(advance)
        try:
            yield
        finally:
            handle.remove()


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


# -- diff ------------------------------------------------------------------------------------

from .diff_command import diff_command  # noqa: E402 (registered after the group is made)

cli.add_command(diff_command)
