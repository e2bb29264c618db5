"""What `shapeguard trace` and `shapeguard check` share: their options, parsed into a
`Target`, which also turns the library's failures into the CLI's exit statuses and
writes the `--json` and `--html` files."""

import contextlib
import functools

import click

from .errors import Failed, UsageFailure
from .loader import LoadError, ModelCrashed

_OPTIONS = (
    click.argument("file", required=False, type=click.Path(dir_okay=True, path_type=str)),
    click.argument("script_args", nargs=-1, type=click.UNPROCESSED),
    click.option(
        "-m",
        "module_name",
        metavar="MODULE",
        help="Load the model from a module, found from the working directory as "
        "`python -m MODULE` finds it (a package's relative imports work): -m mypkg.model.",
    ),
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
        "--input mask=bool:2,16 (a mask gets padding). Overrides example_inputs() for that name. "
        "A forward(*args) takes its positional inputs in order: --input args=2,16,512.",
    ),
    click.option(
        "--dim",
        "dim_items",
        multiple=True,
        metavar="NAME=SIZE",
        help="Size of a named dim for inputs made from annotations or the "
        "model's structure (repeatable): --dim seq=128.",
    ),
    click.option(
        "--device",
        type=click.Choice(["cpu", "meta"]),
        default="cpu",
        show_default=True,
        help="meta: build the model and its inputs on the meta device (no memory; "
        "shape errors are still caught, checks that read values cannot run).",
    ),
    click.option(
        "--json",
        "json_path",
        metavar="FILE",
        help="Write the report as JSON (schema in docs/json-schema.md); '-' for stdout "
        "instead of the table (the model's own prints then go to stderr).",
    ),
    click.option("--html", "html_path", metavar="FILE", help="Write a self-contained HTML report."),
    click.option(
        "--format",
        "output_format",
        type=click.Choice(["text", "github"]),
        default="text",
        show_default=True,
        help="github: one ::error / ::warning line per finding on stdout, which GitHub "
        "Actions shows as an annotation at its file and line.",
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
)
# The parameter names the options above give, in order.
_PARAMS = (
    "file",
    "script_args",
    "module_name",
    "model_name",
    "arg_items",
    "input_items",
    "dim_items",
    "device",
    "json_path",
    "html_path",
    "output_format",
    "strict",
    "show_traceback",
)


def target_options(command):
    """Add the shared options to a click command, which gets them parsed as `target`.

    FILE may be followed by `--` and the arguments the file's own `sys.argv` gets:
    `shapeguard trace train.py -- --d_model 64`.
    """

    @functools.wraps(command)
    def with_target(**options):
        target = Target(**{name: options.pop(name) for name in _PARAMS})
        with target.json_only_stdout():
            return command(target, **options)

    for option in reversed(_OPTIONS):
        with_target = option(with_target)
    return with_target


class Target:
    """The shared options, parsed: which model to build, with which inputs, and where the
    report goes."""

    def __init__(
        self,
        *,
        file,
        script_args,
        module_name,
        model_name,
        arg_items,
        input_items,
        dim_items,
        device,
        json_path,
        html_path,
        output_format,
        strict,
        show_traceback,
    ):
        from . import inputs as _inputs
        from . import picking as _picking

        self.module = module_name
        self.script_args = tuple(script_args)
        if module_name is not None and file is not None:
            # `-m pkg.model -- --lr 3`: every positional argument is the module's own.
            self.script_args = (file, *self.script_args)
            file = None
        self.file = file if module_name is None else module_name
        self.path = file
        self.model_name = model_name
        self.device = device
        self.json_path = json_path
        self.html_path = html_path
        self.format = output_format
        self.strict = strict
        self.show_traceback = show_traceback
        # `--json -`'s JSON, held until the command is done (`json_only_stdout`).
        self._json_held: list[str] | None = None
        # The options that pick the model and its inputs, as given: what a simulated
        # rank's subprocess (`trace --tp`) runs with.
        self.argv = [
            *(["-m", module_name] if module_name is not None else [file]),
            *(["--model", model_name] if model_name else []),
            *(x for item in arg_items for x in ("--arg", item)),
            *(x for item in input_items for x in ("--input", item)),
            *(x for item in dim_items for x in ("--dim", item)),
            "--device",
            device,
            *(["--strict"] if strict else []),
            *(["--", *self.script_args] if self.script_args else []),
        ]
        with self.translate():
            if file is None and module_name is None:
                raise LoadError(
                    "give the path of a Python file that defines the model, or -m MODULE"
                )
            self.kwargs = _picking.parse_assignments(arg_items, "--arg")
            self.specs = _inputs.parse_input_specs(input_items)
            self.dims = _inputs.parse_dims(dim_items)

    @contextlib.contextmanager
    def loaded(self):
        """FILE imported as a module while in the block (`_loader.loaded`), with its own
        argv; a failure in the block becomes the CLI's exit status (`translate`)."""
        from . import loader as _loader

        quiet_torch()
        with (
            self.translate(),
            _loader.loaded(self.path, module=self.module, argv=self.script_args) as module,
        ):
            yield module

    @contextlib.contextmanager
    def json_only_stdout(self):
        """With `--json -`, stdout holds the JSON alone: whatever else writes to it while the
        block runs (the model's prints at import, build and forward) goes to stderr, and the
        JSON is written once the block is left, also on a failure."""
        if self.json_path != "-":
            yield
            return
        from .json_stdout import stdout_to_stderr

        self._json_held = []
        try:
            with stdout_to_stderr():
                yield
        finally:
            held, self._json_held = self._json_held, None
            for text in held:
                click.echo(text)

    def _echo_json(self, text: str) -> None:
        if self._json_held is None:
            click.echo(text)
        else:
            self._json_held.append(text)

    @contextlib.contextmanager
    def translate(self):
        """Turn library exceptions into the CLI's exit statuses (ShapeError: the report on stdout)."""
        from .._errors import ShapeError

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
            from .malformed import malformed_contract

            malformed = malformed_contract(error.error)
            if malformed is not None:
                raise UsageFailure(str(malformed), error.error, self.show_traceback) from None
            self._report_early("model_crashed", error.message, error.location, "")
            raise Failed(
                f"the model crashed: {error.phase}", error.__cause__ or error, self.show_traceback
            ) from None

    def _report_early(self, kind: str, message: str, location: str, hint: str) -> None:
        """A failure before any forward ran (importing or building the model): the message on
        stdout, and a trace holding only that finding for --json and --html."""
        from ..report.text import render_github
        from .run import failure_trace

        trace = failure_trace(kind, message, location, hint)
        self.write_files(trace)
        if self.json_path == "-":
            self._echo_json(trace.to_json())
        elif self.format == "github":
            click.echo(render_github(trace), nl=False)
        else:
            echo(f"error: {message}\n")

    def report(self, trace, header: str, body, *, check=None, attention=None) -> None:
        """Write the --json and --html files, then on stdout the JSON (`--json -`), the
        annotations (`--format github`) or `header` and the text `body()` returns.

        Args:
            check: `shapeguard check`'s summary (`_check_summary.Summary`), or None.
            attention: heatmap data for --html (`capture_attention`), or None.
        """
        from .. import _ranks
        from ..report.text import render_github

        self.write_files(trace, check=check, attention=attention)
        if self.json_path == "-":
            self._echo_json(_json(trace, check))
        elif self.format == "github":
            click.echo(render_github(trace, check.rows if check else ()), nl=False)
        elif _ranks.shows_full_report():
            echo(f"{header}\n{body()}")
        else:
            echo(rank_summary(trace))

    def write_files(self, trace, *, check=None, attention=None) -> None:
        from .. import _ranks

        if self.json_path and self.json_path != "-":
            write_report(_ranks.rank_path(self.json_path), _json(trace, check))
        if self.html_path:
            try:
                from ..report.html import render_html
            except ImportError as error:
                raise UsageFailure(f"--html is not available in this version ({error})") from None
            checks = check.rows if check else None
            page = render_html(trace, attention, checks=checks, probe_reach=_probe_reach(check))
            write_report(_ranks.rank_path(self.html_path), page)


def _probe_reach(check) -> dict | None:
    """The reach the probes measured (the reach probe's record), for --html; or None."""
    report = getattr(check, "report", None)
    for result in report.results if report is not None else ():
        if result.reach is not None:
            return result.reach.to_dict()
    return None


def echo(text: str) -> None:
    """The report on stdout; on one rank of several, each line prefixed `[rank r/N]` and
    written whole, so the ranks' lines interleave but never their characters."""
    from .. import _ranks

    if _ranks.prefix():
        _ranks.write_lines(text)
    else:
        click.echo(text, nl=False)


def rank_summary(trace) -> str:
    """What a rank other than rank 0 prints: its findings, one line each (rank 0 prints
    the whole report; `shapeguard merge` of the --json files gives them all together)."""
    lines = [
        f"{f.severity} {f.kind} at {f.location or f.module}: {f.headline}" for f in trace.findings
    ]
    count = len(trace.findings)
    lines.append(
        f"{count} finding{'s' if count != 1 else ''} on this rank; the full report is rank "
        "0's (SHAPEGUARD_RANKS=all prints every rank's)"
    )
    return "\n".join(lines) + "\n"


def quiet_torch() -> None:
    """Import torch with its NumPy warning silenced: without numpy installed, torch warns
    "Failed to initialize NumPy" once, at import, about a feature shapeguard never uses."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        import torch  # noqa: F401


def _json(trace, check) -> str:
    import json

    data = trace.to_dict()
    if check is not None:
        data["check"] = check.to_dict()
    return json.dumps(data, indent=2)


def write_report(path: str, text: str) -> None:
    """Write a report the user named; a path that cannot be written is a usage error in
    one line, not a traceback."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        raise UsageFailure(f"cannot write {path}: {error.strerror}") from None
