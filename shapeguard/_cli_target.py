"""What `shapeguard trace` and `shapeguard check` share: their options, parsed into a
`Target`, which also turns the library's failures into the CLI's exit statuses and
writes the `--json` and `--html` files."""

import contextlib
import functools

import click

from ._cli_errors import Failed, UsageFailure
from ._loader import LoadError, ModelCrashed

_OPTIONS = (
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
    click.option("--html", "html_path", metavar="FILE", help="Write a self-contained HTML report."),
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
    "model_name",
    "arg_items",
    "input_items",
    "dim_items",
    "device",
    "json_path",
    "html_path",
    "strict",
    "show_traceback",
)


def target_options(command):
    """Add the shared options to a click command, which gets them parsed as `target`."""

    @functools.wraps(command)
    def with_target(**options):
        target = Target(**{name: options.pop(name) for name in _PARAMS})
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
        from . import _inputs, _loader

        self.file = file
        self.model_name = model_name
        self.device = device
        self.json_path = json_path
        self.html_path = html_path
        self.strict = strict
        self.show_traceback = show_traceback
        with self.translate():
            self.kwargs = _loader.parse_assignments(arg_items, "--arg")
            self.specs = _inputs.parse_input_specs(input_items)
            self.dims = _inputs.parse_dims(dim_items)

    @contextlib.contextmanager
    def loaded(self):
        """FILE imported as a module while in the block (`_loader.loaded`); a failure in the
        block becomes the CLI's exit status (`translate`)."""
        from . import _loader

        with self.translate(), _loader.loaded(self.file) as module:
            yield module

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
        from ._run import failure_trace

        trace = failure_trace(kind, message, location, hint)
        self.write_files(trace)
        click.echo(trace.to_json() if self.json_path == "-" else f"error: {message}")

    def report(self, trace, header: str, body) -> None:
        """Write the --json and --html files, then on stdout the JSON (`--json -`) or
        `header` and the text `body()` returns."""
        self.write_files(trace)
        if self.json_path == "-":
            click.echo(trace.to_json())
        else:
            click.echo(header)
            click.echo(body(), nl=False)

    def write_files(self, trace) -> None:
        if self.json_path and self.json_path != "-":
            _write(self.json_path, trace.to_json())
        if self.html_path:
            try:
                html = trace.to_html()
            except ImportError as error:
                raise UsageFailure(f"--html is not available in this version ({error})") from None
            _write(self.html_path, html)


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as error:
        raise UsageFailure(f"cannot write {path}: {error.strerror}") from None
