"""`shapeguard run`'s program: the user's script or module, run as `python script.py` or
`python -m module` runs it.

As `coverage run` and `python -m cProfile` do, through `runpy`: the program is `__main__`,
`sys.argv` is what it would see (`[script, *args]`; for `-m`, the module's file first),
`sys.path[0]` is the script's folder (symlinks resolved, as the interpreter does) or, for
`-m`, the working directory, and the working directory is left alone. `sys.argv`,
`sys.path` and `sys.modules["__main__"]` are put back afterwards. How it ended is returned
as the interpreter would end: `SystemExit`'s status, 1 (traceback printed) for an uncaught
exception, 130 for Ctrl-C; `Stopped` (raised by `--steps`) ends it cleanly with 0.
"""

import functools
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from .._source import stop_at


class Stopped(BaseException):
    """Raised into the program to end it early (`--steps` reached): a BaseException, so the
    program's own `except Exception` does not swallow it."""


class ProgramNotFound(Exception):
    """The script or module does not exist: a usage error, not the program's failure."""


@dataclass(slots=True)
class Ended:
    """How the program ended: `status` is the exit status `python` would have given."""

    status: int
    interrupted: bool = False  # Ctrl-C (KeyboardInterrupt)
    stopped: bool = False  # `Stopped`: ended early on purpose
    crashed: bool = False  # an uncaught exception other than SystemExit


def run_program(path: str | None, module: str | None, args: Sequence[str]) -> Ended:
    """Run the script at `path` (or the module `module`) as `__main__` with `args` after
    its name in `sys.argv`; print an uncaught exception's traceback on stderr as the
    interpreter does, and return how it ended."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_main = sys.modules.get("__main__")
    try:
        if module is not None:
            sys.argv = [module, *args]  # runpy puts the module's file first
            sys.path[0:1] = [os.getcwd()]
            _check_module(module)
            runner = functools.partial(_run_module, module)
        else:
            if path is None or not os.path.isfile(path):
                raise ProgramNotFound(f"no such file: {path}")
            sys.argv = [path, *args]
            sys.path[0:1] = [os.path.dirname(os.path.realpath(path))]
            runner = functools.partial(_run_path, path)
        return _ended(runner)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _run_path(path: str) -> None:
    runpy.run_path(path, run_name="__main__")


def _run_module(module: str) -> None:
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _check_module(module: str) -> None:
    """A module that cannot be found is a usage error (`python -m` says "No module named")."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError) as error:
        raise ProgramNotFound(f"cannot find module {module}: {error}") from None
    if found is None:
        raise ProgramNotFound(f"no module named {module}")


def _ended(run) -> Ended:
    """Run the program; its end as the interpreter would report it."""
    try:
        run()
    except SystemExit as exit_:
        return Ended(_exit_status(exit_.code))
    except Stopped:
        return Ended(0, stopped=True)
    except KeyboardInterrupt as error:
        _print_uncaught(error)
        return Ended(130, interrupted=True)
    except BaseException as error:  # the program's own uncaught error, printed as python does
        _print_uncaught(error)
        return Ended(1, crashed=True)
    return Ended(0)


def _exit_status(code: object) -> int:
    """`sys.exit(code)`'s status: None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # as the process's status: exit(-1) is 255
    print(code, file=sys.stderr)
    return 1


def _print_uncaught(error: BaseException) -> None:
    """The traceback python prints, from the program's first frame (runpy's and shapeguard's
    frames above it left out)."""
    tb = error.__traceback__
    while tb is not None and _is_runner_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    sys.stdout.flush()
    traceback.print_exception(type(error), error, tb, file=sys.stderr)


def _is_runner_frame(filename: str) -> bool:
    return filename in (__file__, runpy.__file__) or filename.startswith("<frozen runpy")


# The user's frames are the program's: the frames below it (click, the console script)
# are never theirs.
stop_at(_run_path.__code__)
stop_at(_run_module.__code__)
