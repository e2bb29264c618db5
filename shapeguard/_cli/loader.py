"""From a model file to a module: load the file (`picking` picks the model and builds it).

Everything a user can get wrong here (a missing file, a syntax error, no model
or two, bad `--arg`) is a `LoadError`: one line saying what is wrong and how to
fix it. The model itself failing (its constructor, its forward) is a
`ModelCrashed`, or the `ShapeError` shapeguard raised: a finding, not a usage error.
"""

import contextlib
import importlib.util
import os
import sys
import traceback
from types import ModuleType

from .. import _source
from .._errors import ShapeError, format_message


class LoadError(Exception):
    """The file or the options cannot give a model: a usage error (exit status 2)."""


class ModelCrashed(Exception):
    """The user's code raised something other than a ShapeError (exit status 1).

    `message` is rendered in the house format, at the user's innermost source line, with
    the error's whole text (einops explains itself on its second and third lines).
    """

    def __init__(self, phase: str, error: BaseException, path: str = "") -> None:
        self.phase = phase
        self.error = error
        location, source = _user_frame(error, path)
        self.location = location
        self.source = source
        lines = error_lines(error)
        self.relation = f"{phase} raised {type(error).__name__}" + (
            ": " + "\n    ".join(lines) if lines else ""
        )
        known = _crash_hint(error)
        # A hint that only says whose error it is: one that knows more may take its place.
        self.generic = not known
        self.hint = known or (
            "this is an error in the model's own code, not a shape rule; "
            "run with --traceback to see the full stack"
        )
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return format_message(
            self.relation, location=self.location, source=self.source, hint=self.hint
        )


def error_lines(error: BaseException, limit: int = 8) -> list[str]:
    """The lines of an error's message, without the C++ frames torch sometimes appends."""
    lines = []
    for line in str(error).strip().splitlines():
        if line.startswith(("Exception raised from", "frame #")):
            break
        if line.strip():
            lines.append(line.strip())
    return lines[:limit]


def _crash_hint(error: BaseException) -> str:
    """A hint for the failures whose meaning is known: einops' head split, memory."""
    import re

    text = str(error)
    found = re.search(r"can't divide axis of length (\d+) in chunks of (\d+)", text)
    if found:
        from .._names.axes import divisors

        size, parts = int(found.group(1)), int(found.group(2))
        fits = ", ".join(str(d) for d in divisors(size) if d > 1)
        return (
            f"{size} features do not split into {parts} heads: the head count must divide the "
            f"width (head counts that divide {size}: {fits})"
        )
    if type(error).__name__ == "EinopsError":
        return "einops could not apply the pattern to this shape: compare its axes with the shape above"
    return ""


def is_memory_error(error: BaseException) -> bool:
    """torch's allocator (or Python) refused the memory, or a size overflowed."""
    if isinstance(error, MemoryError | OverflowError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError | TypeError) and any(
        part in text
        for part in (
            "can't allocate memory",
            "DefaultCPUAllocator",
            "out of memory",
            "not enough memory",
            "Overflow when unpacking",
        )
    )


def _user_frame(error: BaseException, path: str) -> tuple[str, str]:
    """`file:line` and source of the innermost frame in the model's own folder (the file,
    its package), else the innermost outside torch, shapeguard and einops."""

    frames = traceback.extract_tb(error.__traceback__)
    folder = os.path.dirname(os.path.abspath(path)) + os.sep if path else ""
    chosen = None
    for frame in frames:
        where = os.path.abspath(frame.filename)
        if folder and where.startswith(folder) and not _source.is_internal(where):
            chosen = frame
    if chosen is None:
        for frame in frames:
            if not _source.is_internal(os.path.abspath(frame.filename)):
                chosen = frame
    if chosen is None:
        return "", ""
    return f"{_source.display_path(chosen.filename)}:{chosen.lineno}", (chosen.line or "").strip()


# -- loading the file ------------------------------------------------------------------------


_loaded_count = 0


@contextlib.contextmanager
def loaded(path: str | None = None, *, module: str | None = None, argv: tuple = ()):
    """Import a model file as `python FILE` would, without running its `__main__` block,
    the module while in the block.

    `path` is a .py file, run as `python FILE` runs it (`_module_name`): a file inside a
    package (folders with `__init__.py`) is imported under its package (`pkg.model`) only
    when it imports from the package, so its relative imports work. `module`
    (instead of `path`) is a dotted name found from the working directory, as `python -m`
    finds it. While in the block, `sys.argv` is `[path, *argv]` (so a script that parses
    its arguments at import sees its own), the file's folder (and the package's parent)
    is importable, and the modules imported from there are dropped again afterwards,
    with `sys.argv`, `sys.path` and any module of the same name put back as they were.
    """
    global _loaded_count
    name: str | None
    local: list[str] | tuple[str, ...]
    if module is not None:
        name, path, search, local = _find_module(module)
        argv0 = path
    else:
        argv0 = path or ""  # as given; _check_file refuses an empty path
        path = _check_file(path)
        name, search, local = _module_name(path)
    code = _compile(path)
    if name is None:
        _loaded_count += 1
        name = f"_shapeguard_target_{_loaded_count}"
    local = tuple(os.path.join(folder, "") for folder in local)
    saved_argv, saved_path = sys.argv, list(sys.path)
    before = dict(sys.modules)
    ours = name.split(".")[0]
    for existing in [n for n in sys.modules if n == ours or n.startswith(ours + ".")]:
        del sys.modules[existing]
    sys.path[:0] = search
    sys.argv = [argv0, *argv]
    shown = os.path.basename(path) if module is None else module
    try:
        target = _execute(name, path, code, shown)
        try:
            yield target
        except SystemExit as error:
            raise LoadError(
                f"{shown} called sys.exit({error.code!r}); pass the script's own arguments "
                f"after --, e.g. shapeguard trace {shown} -- --lr 0.1"
            ) from None
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        # The model's own modules go; those of packages loaded before (torch, shapeguard) stay.
        loaded_before = {n.split(".")[0] for n in before}
        for added in [n for n in sys.modules if n not in before]:
            where = getattr(sys.modules[added], "__file__", None) or ""
            top = added.split(".")[0]
            mine = top == ours or (
                top not in loaded_before and where and os.path.abspath(where).startswith(local)
            )
            if mine:
                del sys.modules[added]
        for old, value in before.items():
            if sys.modules.get(old) is not value and (old == ours or old.startswith(ours + ".")):
                sys.modules[old] = value


def _check_file(path: str | None) -> str:
    if not path:
        raise LoadError("give the path of a Python file that defines the model, or -m MODULE")
    if not os.path.exists(path):
        raise LoadError(
            f"no such file: {path}; give the path of a Python file that defines the model"
        )
    if os.path.isdir(path):
        raise LoadError(
            f"{path} is a folder; give the path of a Python file that defines the model"
        )
    if not path.endswith(".py"):
        raise LoadError(
            f"{path} is not a .py file; give the path of a Python file that defines the model"
        )
    return os.path.abspath(path)


def _module_name(path: str) -> tuple[str | None, list[str], list[str]]:
    """The name to import `path` under, the folders to make importable and the folders
    whose modules are the model's own.

    As `python FILE` runs it: the file's folder first on the path, the file a module of its
    own, the package around it never imported (its `__init__` may import what the file
    does not need). A file in a package that asks for its package (a relative import, or
    an import of the package by name) is imported under it (`pkg.sub.model`) with the
    package's parent first on the path, so that the file's folder cannot shadow the
    package (`pkg/pkg.py`). Any other file keeps its stem (a fresh name when that one is
    taken)."""
    folder = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    parts = [] if stem == "__init__" else [stem]
    root = folder
    while (
        os.path.isfile(os.path.join(root, "__init__.py")) and os.path.basename(root).isidentifier()
    ):
        parts.insert(0, os.path.basename(root))
        root = os.path.dirname(root)
    in_package = root != folder and all(p.isidentifier() for p in parts)
    if in_package and (stem == "__init__" or asks_for_package(path, parts[0])):
        return ".".join(parts), [root, folder], [os.path.join(root, parts[0])]
    name = stem if stem.isidentifier() and stem not in sys.modules else None
    return name, [folder], [folder]


def asks_for_package(path: str, package: str) -> bool:
    """Whether the file at `path` imports from its package: a relative import, or an
    import of `package` (the top package around it) by name, anywhere in the file."""
    import ast

    try:
        with open(path, "rb") as f:
            tree = _source.parse(f.read().decode("utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False  # _compile says what is wrong with the file
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] == package
        ):
            return True
        if isinstance(node, ast.Import) and any(
            alias.name.split(".")[0] == package for alias in node.names
        ):
            return True
    return False


def _find_module(dotted: str) -> tuple[str, str, list[str], list[str]]:
    """`-m pkg.model`: the module's name, its file, the folders to make importable and the
    model's own folder, looked up from the working directory as `python -m` does."""
    cwd = os.getcwd()
    if not all(part.isidentifier() for part in dotted.split(".")):
        raise LoadError(f"-m {dotted!r} is not a dotted module name; write e.g. -m mypkg.model")
    saved_path, before = list(sys.path), set(sys.modules)
    sys.path.insert(0, cwd)
    reason = ""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError) as error:
        spec, reason = None, f" ({error})"
    finally:
        sys.path[:] = saved_path
        for added in set(sys.modules) - before:  # find_spec imported the parent packages
            del sys.modules[added]
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise LoadError(
            f"no module named {dotted!r} under {display(cwd)}{reason}; run from the folder "
            "above the package, or give the path of the file"
        )
    top = os.path.dirname(spec.origin)
    for _ in dotted.split(".")[1:]:
        top = os.path.dirname(top)
    return dotted, spec.origin, [cwd], [top]


def display(path: str) -> str:

    return _source.display_path(path) or "."


def _compile(path: str):
    try:
        with open(path, "rb") as f:
            return compile(f.read(), path, "exec")
    except SyntaxError as error:
        where = (
            f"{_source.display_path(path)}:{error.lineno}"
            if error.lineno
            else _source.display_path(path)
        )
        raise LoadError(
            f"syntax error at {where}: {error.msg}; fix the file and run again"
        ) from error
    except (OSError, ValueError) as error:
        raise LoadError(f"cannot read {path}: {error}") from error


def _execute(name: str, path: str, code, shown: str) -> ModuleType:
    """Run `code` as the module `name` (its parent packages imported first)."""
    parent = name.rpartition(".")[0]
    is_package = os.path.basename(path) == "__init__.py"
    try:
        if parent:
            importlib.import_module(parent)
        spec = importlib.util.spec_from_file_location(
            name,
            path,
            submodule_search_locations=[os.path.dirname(path)] if is_package else None,
        )
        if spec is None:  # never for a .py file: the source loader takes every one
            raise ImportError(f"no loader for {path}")
        module = importlib.util.module_from_spec(spec)
        # Registered before it runs: dataclasses and pickling look the module up by name.
        sys.modules[name] = module
        exec(code, module.__dict__)
    except ShapeError:
        raise
    except SystemExit as error:
        raise LoadError(
            f"{shown} called sys.exit({error.code!r}) while being imported (argparse?); pass "
            f"the script's own arguments after --, e.g. shapeguard trace {shown} -- --lr 0.1"
        ) from None
    except ImportError as error:
        raise LoadError(
            f"importing {shown} failed: {error}; install what it imports, "
            "or run from the folder its imports expect"
        ) from error
    except Exception as error:
        raise ModelCrashed(f"importing {shown}", error, path) from error
    return module
