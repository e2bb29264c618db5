"""From a loaded model file to a model: pick the class or factory (`--model`, or the one
the file defines), bind `--arg` and its defaults, and build it on a device."""

import ast
import contextlib
import inspect
import os
import typing
from dataclasses import dataclass, field
from types import ModuleType

from .. import _source
from .._errors import ShapeError
from .loader import LoadError, ModelCrashed, error_lines, is_memory_error
from .meta_build import built_on_meta


@dataclass(slots=True)
class Picked:
    """The model, and how it was found (for the report's header line)."""

    model: object
    how: str
    path: str = ""
    kwargs: dict = field(default_factory=dict)
    # How the header shows an argument shapeguard made (`config=TinyConfig()`).
    shown: dict = field(default_factory=dict)
    # `file:line` of what built the model in the file (`model = ...`, `def build_model`).
    site: str = ""
    # Why it was built on the meta device though cpu was asked for ("" where it was not):
    # too large at its defaults (`meta_build`).
    on_meta: str = ""


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
        return Picked(model, how, path, site=_site(module, target))
    if not callable(target):
        raise LoadError(
            f"{how} is a {type(target).__name__}, not an nn.Module, a class or a factory"
        )
    made = _defaults(target, kwargs, module, how)
    _check_binds(target, kwargs, how, tuple(made))
    shown = {}
    for name, (value, text) in made.items():
        kwargs[name], shown[name] = value, text
    big = None
    if device == "cpu":
        big = built_on_meta(lambda: target(**kwargs), asked=bool(set(kwargs) - set(made)))
    if big is not None:
        site = _site(module, target)
        return Picked(_to_meta(big[0]), how, path, kwargs, shown, site, on_meta=big[1])
    try:
        with on_device(device):
            model = target(**kwargs)
    except ShapeError as error:
        raise _located(error, target, kwargs, path) from None
    except Exception as error:
        if is_memory_error(error):
            first = (error_lines(error) or [type(error).__name__])[0]
            raise LoadError(
                f"building the model ({_call_text(target, kwargs, shown)}) needs more memory "
                f"than is free ({first}); use --device meta to check shapes with no memory"
            ) from None
        raise ModelCrashed(
            f"building the model ({_call_text(target, kwargs, shown)})", error, path
        ) from error
    if not isinstance(model, torch.nn.Module):
        raise LoadError(
            f"{_call_text(target, kwargs, shown)} returned a {type(model).__name__}, not an nn.Module"
        )
    if device == "meta":
        model = _to_meta(model)
    return Picked(model, how, path, kwargs, shown, _site(module, target))


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
        tree = _source.parse(inspect.getsource(module))
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


def _check_binds(target, kwargs: dict, how: str, made: tuple = ()) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(**kwargs, **dict.fromkeys(made))
    except TypeError as error:
        params = [
            p
            for p in signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        missing = [
            p.name
            for p in params
            if p.default is p.empty and p.name not in kwargs and p.name not in made
        ]
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
                + ", or add a build_model() function to the file"
            ) from None
        raise LoadError(f"{how} cannot take these arguments: {error}") from None


_CONFIG_WORDS = ("config", "cfg", "conf", "hparams", "params", "args", "opt", "settings")


def _defaults(target, kwargs: dict, module: ModuleType, how: str) -> dict[str, tuple]:
    """Values for the constructor parameters that need an object `--arg` cannot write: a
    config made by its class's defaults, the class read from the parameter's annotation or
    the file's one `*Config` class. {name: (value, how the header shows it)}."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return {}
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:
        hints = {}
    made: dict[str, tuple] = {}
    for param in signature.parameters.values():
        if param.name in kwargs or param.default is not param.empty:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, param.annotation)
        cls = (
            annotation
            if inspect.isclass(annotation)
            and annotation is not param.empty
            and annotation.__module__ not in ("builtins", "typing")
            else None
        )
        if cls is None and param.name.lower().endswith(_CONFIG_WORDS):
            cls = _config_class(module, target, param.name, how)
        if cls is None:
            continue
        try:
            made[param.name] = (cls(), f"{cls.__name__}()")
        except Exception as error:
            raise LoadError(
                f"{how} needs {param.name}, and {cls.__name__}() fails without arguments "
                f"({type(error).__name__}: {error}); add a build_model() function to the file"
            ) from None
    return made


def _config_class(module: ModuleType, target, param: str, how: str) -> type | None:
    """The file's config class for `param`: the one class named like a config that builds
    with no arguments (the one named after the model when there are several)."""
    candidates = []
    for value in vars(module).values():
        if not inspect.isclass(value) or not value.__name__.endswith(("Config", "Args", "Params")):
            continue
        try:
            inspect.signature(value).bind()
        except (TypeError, ValueError):
            continue
        candidates.append(value)
    if len(candidates) > 1:
        stem = getattr(target, "__name__", "")
        named = [c for c in candidates if stem.startswith(c.__name__.removesuffix("Config"))]
        candidates = named if len(named) == 1 else candidates
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        names = ", ".join(c.__name__ for c in candidates)
        raise LoadError(
            f"{how} needs {param}, and the file has several config classes ({names}); add a "
            "build_model() function that builds the model with the one you mean"
        )
    raise LoadError(
        f"{how} needs {param}, a config object; --arg takes only literals, and the file has no "
        f"config class to build one with its defaults: add a build_model() function to the file"
    )


def _site(module: ModuleType, target) -> str:
    """`file:line` where the file builds or defines the model: the `model = ...` statement,
    else the function or class definition."""

    path = getattr(module, "__file__", None) or ""
    if not path:
        return ""
    line = 0
    if inspect.isclass(target) or inspect.isfunction(target):
        try:
            line = inspect.getsourcelines(target)[1]
        except (OSError, TypeError):
            line = 0
    else:
        try:
            tree = _source.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            tree = None
        for node in getattr(tree, "body", ()):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and getattr(module, t.id, None) is target
                for t in node.targets
            ):
                line = node.lineno
    return f"{_source.display_path(path)}:{line}" if line else ""


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

    return ShapeError(
        error.relation,
        kind=error.kind,
        op=error.op,
        module=error.module,
        location=f"{_source.display_path(path)}:{line}" if line else _source.display_path(path),
        source=f"{_call_text(target, kwargs)}  # called by shapeguard",
        operands=error.operands,
        hint=error.hint,
    )


def _call_text(target, kwargs: dict, shown: dict | None = None) -> str:
    name = getattr(target, "__name__", type(target).__name__)
    shown = shown or {}
    return f"{name}(" + ", ".join(f"{k}={shown.get(k) or repr(v)}" for k, v in kwargs.items()) + ")"


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
