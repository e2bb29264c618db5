"""From a model file to a model: load the file, pick the model, build it.

Everything a user can get wrong here (a missing file, a syntax error, no model
or two, bad `--arg`) is a `LoadError`: one line saying what is wrong and how to
fix it. The model itself failing (its constructor, its forward) is a
`ModelCrashed`, or the `ShapeError` shapeguard raised: a finding, not a usage error.
"""

import ast
import contextlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from types import ModuleType

from ._errors import ShapeError, format_message


class LoadError(Exception):
    """The file or the options cannot give a model: a usage error (exit status 2)."""

    exit_code = 2


class ModelCrashed(Exception):
    """The user's code raised something other than a ShapeError (exit status 1).

    `message` is rendered in the house format, at the user's innermost source line.
    """

    exit_code = 1

    def __init__(self, phase: str, error: BaseException, path: str = "") -> None:
        self.phase = phase
        self.error = error
        location, source = _user_frame(error, path)
        self.location = location
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        relation = f"{phase} raised {type(error).__name__}" + (f": {first}" if first else "")
        self.message = format_message(
            relation,
            location=location,
            source=source,
            hint="this is an error in the model's own code, not a shape rule; "
            "run with --traceback to see the full stack",
        )
        super().__init__(self.message)


def _user_frame(error: BaseException, path: str) -> tuple[str, str]:
    """`file:line` and source of the innermost frame in the model file (else outside torch)."""
    frames = traceback.extract_tb(error.__traceback__)
    target = os.path.abspath(path) if path else ""
    chosen = None
    for frame in frames:
        if target and os.path.abspath(frame.filename) == target:
            chosen = frame
    if chosen is None:
        internal = (os.sep + "torch" + os.sep, os.sep + "shapeguard" + os.sep, "<frozen")
        for frame in frames:
            if not any(part in frame.filename for part in internal):
                chosen = frame
    if chosen is None:
        return "", ""
    from ._source import display_path

    return f"{display_path(chosen.filename)}:{chosen.lineno}", (chosen.line or "").strip()


# -- loading the file ------------------------------------------------------------------------


_loaded_count = 0


@contextlib.contextmanager
def loaded(path: str):
    """Import the Python file at `path` as a module, its folder importable while in the block.

    The module gets the file's stem as its name (not `__main__`, so the file's
    `if __name__ == "__main__":` block does not run), or a unique variant of it
    when that name is already imported.
    """
    global _loaded_count
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
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() and stem not in sys.modules else None
    if name is None:
        _loaded_count += 1
        name = f"_shapeguard_target_{_loaded_count}"
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
    except SyntaxError as error:
        from ._source import display_path

        where = f"{display_path(path)}:{error.lineno}" if error.lineno else display_path(path)
        raise LoadError(
            f"syntax error at {where}: {error.msg}; fix the file and run again"
        ) from error
    except (OSError, ValueError) as error:
        raise LoadError(f"cannot read {path}: {error}") from error
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    # Registered before it runs: dataclasses and pickling look the module up by name.
    sys.modules[name] = module
    try:
        try:
            exec(code, module.__dict__)
        except ShapeError:
            raise
        except ImportError as error:
            raise LoadError(
                f"importing {os.path.basename(path)} failed: {error}; install what it imports, "
                "or run from the folder its imports expect"
            ) from error
        except Exception as error:
            raise ModelCrashed(f"importing {os.path.basename(path)}", error, path) from error
        yield module
    finally:
        sys.modules.pop(name, None)
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


# -- picking the model -----------------------------------------------------------------------


@dataclass(slots=True)
class Picked:
    """The model, and how it was found (for the report's header line)."""

    model: object
    how: str
    path: str = ""
    kwargs: dict = field(default_factory=dict)


def parse_assignments(items: tuple[str, ...] | list[str], option: str) -> dict:
    """`["n_heads=6", "bias=False"]` -> `{"n_heads": 6, "bias": False}` (Python literals).

    A value that is not a literal but reads as a bare word (`gelu`, `cuda:0`) is
    kept as a string; anything else is a LoadError.
    """
    out: dict = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name.isidentifier():
            raise LoadError(f"{option} {item!r} is not NAME=VALUE; write e.g. {option} n_heads=8")
        text = text.strip()
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            if not text or not all(c.isalnum() or c in "_-.:/" for c in text) or text[0].isdigit():
                raise LoadError(
                    f"{option} {item!r}: {text!r} is not a Python literal; write a number, "
                    "True/False/None, a quoted string or a tuple"
                ) from None
            value = text
        out[name] = value
    return out


def pick_model(
    module: ModuleType, *, name: str | None = None, kwargs: dict | None = None, device: str = "cpu"
) -> Picked:
    """The model a file defines: `--model NAME`, else `model`, else `build_model()`, else the
    one nn.Module subclass defined in the file (the one no other class there builds).

    With `kwargs` (from `--arg`), a module-level instance is skipped and `build_model`
    is used only when it takes those keywords; otherwise they go to the class.
    """
    import torch

    kwargs = dict(kwargs or {})
    filename = os.path.basename(module.__file__ or "the file")
    if name is not None:
        if not hasattr(module, name):
            found = ", ".join(_candidates(module)) or "none"
            raise LoadError(f"{filename} has no {name!r}; models found there: {found}")
        target = getattr(module, name)
        how = f"--model {name}"
    else:
        target, how = _default_target(module, kwargs, filename)
    path = module.__file__ or ""
    if isinstance(target, torch.nn.Module):
        if kwargs:
            raise LoadError(
                f"--arg needs a class or a factory, but {how} is an instance already built; "
                "pick the class with --model NAME"
            )
        model = target
        if device == "meta":
            model = _to_meta(model)
        return Picked(model, how, path)
    if not callable(target):
        raise LoadError(
            f"{how} is a {type(target).__name__}, not an nn.Module, a class or a factory"
        )
    _check_binds(target, kwargs, how)
    try:
        with on_device(device):
            model = target(**kwargs)
    except ShapeError as error:
        raise _located(error, target, kwargs, path) from None
    except Exception as error:
        raise ModelCrashed(
            f"building the model ({_call_text(target, kwargs)})", error, path
        ) from error
    if not isinstance(model, torch.nn.Module):
        raise LoadError(
            f"{_call_text(target, kwargs)} returned a {type(model).__name__}, not an nn.Module"
        )
    if device == "meta":
        model = _to_meta(model)
    return Picked(model, how, path, kwargs)


def _default_target(module: ModuleType, kwargs: dict, filename: str):
    import torch

    instance = getattr(module, "model", None)
    if isinstance(instance, torch.nn.Module) and not kwargs:
        return instance, "model"
    factory = getattr(module, "build_model", None)
    if callable(factory) and not isinstance(factory, type) and _binds(factory, kwargs):
        return factory, "build_model()"
    classes = _defined_module_classes(module)
    if not classes:
        if callable(factory) and kwargs:
            _check_binds(factory, kwargs, "build_model()")
        raise LoadError(
            f"{filename} defines no model: add `model = ...`, a `build_model()` function or an "
            "nn.Module class, or name one with --model NAME"
        )
    top = _top_classes(module, classes)
    if len(top) == 1:
        return top[0], top[0].__name__
    names = ", ".join(c.__name__ for c in top)
    raise LoadError(
        f"{filename} defines several models ({names}); pick one with --model NAME "
        "or add a build_model() function"
    )


def _candidates(module: ModuleType) -> list[str]:
    import torch

    names = [n for n, v in vars(module).items() if isinstance(v, torch.nn.Module)]
    names += [c.__name__ for c in _defined_module_classes(module)]
    if callable(getattr(module, "build_model", None)):
        names.append("build_model")
    return names


def _defined_module_classes(module: ModuleType) -> list[type]:
    import torch

    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, torch.nn.Module)
        and value.__module__ == module.__name__
    ]


def _top_classes(module: ModuleType, classes: list[type]) -> list[type]:
    """The classes that no other class of the file builds: `GPT` over `Block` and `MLP`."""
    if len(classes) == 1:
        return classes
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return classes
    names = {c.__name__ for c in classes}
    built: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in names:
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and inner.id in names and inner.id != node.name:
                    built.add(inner.id)
            # A base class is not a model of its own either.
            built.update(b.id for b in node.bases if isinstance(b, ast.Name) and b.id in names)
    top = [c for c in classes if c.__name__ not in built]
    return top or classes


def _binds(target, kwargs: dict) -> bool:
    try:
        inspect.signature(target).bind(**kwargs)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): let the call decide
        return True
    return True


def _check_binds(target, kwargs: dict, how: str) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        params = [
            p
            for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs]
        unknown = [k for k in kwargs if k not in signature.parameters]
        accepts_var_kw = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        if unknown and not accepts_var_kw:
            known = ", ".join(p.name for p in params) or "no arguments"
            raise LoadError(
                f"{how} takes no argument {unknown[0]!r} (it takes: {known}); fix the --arg name"
            ) from None
        if missing:
            raise LoadError(
                f"{how} needs {', '.join(missing)}; pass "
                + " ".join(f"--arg {m}=VALUE" for m in missing)
            ) from None
        raise LoadError(f"{how} cannot take these arguments: {error}") from None


def _located(error: ShapeError, target, kwargs: dict, path: str) -> ShapeError:
    """A ShapeError from building the model, placed in the model file.

    When shapeguard itself made the call (`--arg`, or a class picked by name), the
    innermost user frame is the command line's machinery; the definition of the
    class or factory, with the call shapeguard made, says more.
    """
    where = error.location.rsplit(":", 1)[0]
    if where and path and os.path.abspath(where) == os.path.abspath(path):
        return error
    try:
        lines, line = inspect.getsourcelines(target)
    except (OSError, TypeError):
        lines, line = [], 0
    # Skip decorators: point at the `class` or `def` line itself.
    for offset, text in enumerate(lines):
        if text.lstrip().startswith(("class ", "def ", "async def ")):
            line += offset
            break
    from ._source import display_path

    return ShapeError(
        error.relation,
        kind=error.kind,
        op=error.op,
        module=error.module,
        location=f"{display_path(path)}:{line}" if line else display_path(path),
        source=f"{_call_text(target, kwargs)}  # called by shapeguard",
        operands=error.operands,
        hint=error.hint,
    )


def _call_text(target, kwargs: dict) -> str:
    name = getattr(target, "__name__", type(target).__name__)
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


@contextlib.contextmanager
def on_device(device: str):
    """Make tensors created without a device inside the block on `device` (cpu: as usual)."""
    if device == "cpu":
        yield
        return
    import torch

    with torch.device(device):
        yield


def _to_meta(model):
    """Move what the constructor made off meta (an explicit `device="cpu"` buffer) onto it."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    if all(t.device.type == "meta" for t in tensors):
        return model
    with torch.no_grad():
        return model.to("meta")
