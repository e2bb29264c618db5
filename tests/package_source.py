"""Source files parsed once per process: the tests that read the package's source rather than
run it (tests/test_structure.py, test_layers.py, test_memo.py, test_ops.py) share the trees,
and pytest-xdist's workers import those files at collection. Read the trees, never change
them."""

import ast
import functools
import pathlib


@functools.cache
def parsed(path: pathlib.Path) -> ast.Module:
    """The parsed source of the file at `path`, the same tree on every call."""
    return ast.parse(path.read_text(), str(path))
