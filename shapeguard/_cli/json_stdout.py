"""`--json -`: stdout holds the JSON and nothing else.

The model's own output (a parameter count printed at import or while it is built, a print in
its forward, a child process it starts) would otherwise land on stdout ahead of the JSON, and
`shapeguard trace model.py --json - | jq` would fail to parse it. While a command runs, stdout
goes to stderr; the JSON is written to the real stdout once the command is done with it.
"""

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import TextIO


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Everything written to stdout inside the block goes to stderr: Python's `sys.stdout`
    and, where stdout is a real file, its descriptor too (C code and child processes write
    there). Both are restored on leaving, also on an exception."""
    out, err = sys.stdout, sys.stderr
    moved = _move_descriptor(out, err)
    try:
        with contextlib.redirect_stdout(err):
            yield
    finally:
        if moved is not None:
            fd, saved = moved
            _flush(out)  # written through a reference to the old stream: still stderr's
            _flush(err)
            os.dup2(saved, fd)
            os.close(saved)


def _move_descriptor(out: TextIO, err: TextIO) -> tuple[int, int] | None:
    """Point stdout's descriptor at stderr's: (stdout's descriptor, a copy of what it
    was), or None where either stream is not a file (click's test runner, a notebook)."""
    out_fd, err_fd = _fileno(out), _fileno(err)
    if out_fd is None or err_fd is None or out_fd == err_fd:
        return None
    _flush(out)  # what was written before the block still goes to stdout
    saved = os.dup(out_fd)
    os.dup2(err_fd, out_fd)
    return out_fd, saved


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None


def _flush(stream: TextIO) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream.flush()
