"""The CLI's exit statuses, carried by exception classes (click prints them on stderr).

0 clean; 1 violations found or the model crashed (`Failed`); 2 the command cannot
run as given (`UsageFailure`); 130 interrupted (`Interrupted`, Ctrl-C). No traceback
is shown unless `--traceback` is given.
"""

import sys
import traceback as _traceback

import click


class Failed(click.ClickException):
    """Violations were found or the model crashed: exit status 1, report already on stdout."""

    exit_code = 1
    prefix = "shapeguard: "

    def __init__(
        self, message: str, cause: BaseException | None = None, show_traceback: bool = False
    ):
        super().__init__(message)
        self.cause = cause
        self.show_traceback = show_traceback

    def show(self, file=None) -> None:
        if self.show_traceback and self.cause is not None:
            _traceback.print_exception(self.cause, file=sys.stderr)
        from .. import _ranks

        lead = _ranks.prefix()
        click.echo(f"{lead}{self.prefix}{self.format_message()}", err=True)


class UsageFailure(Failed):
    """The command cannot run as given (file, model, options): exit status 2, one line on stderr."""

    exit_code = 2
    prefix = "shapeguard: error: "


class Interrupted(Failed):
    """Ctrl-C (SIGINT): exit status 130, as a shell reports a command killed by it."""

    exit_code = 130

    def __init__(self) -> None:
        super().__init__("interrupted")
