"""A function's annotations as written: resolved by name, and the source line of each."""

import ast
import inspect

from .. import _source
from .._errors import MalformedContract, first_line


def resolve_hints(fn, signature, qualname: str) -> dict:
    """Annotations by parameter name, string annotations evaluated (jaxtyping skips them)."""
    hints = {}
    items = [(p.name, p.annotation) for p in signature.parameters.values()]
    items.append(("return", signature.return_annotation))
    namespace = getattr(fn, "__globals__", {})
    for name, hint in items:
        if hint is inspect.Parameter.empty:
            continue
        if isinstance(hint, str):
            try:
                hint = eval(hint, dict(namespace))  # noqa: S307 - the user's own annotation
            except Exception as error:
                if not _meant_as_shape(hint):
                    continue  # someone else's forward reference; jaxtyping skips it too
                raise MalformedContract(
                    _bad_string(qualname, name, hint, error), annotation_site(fn, name)
                ) from None
        hints[name] = hint
    return hints


_JAXTYPING_NAMES = (
    "Float",
    "Bool",
    "Int",
    "UInt",
    "Shaped",
    "Num",
    "Real",
    "Integer",
    "Inexact",
    "Complex",
    "BFloat16",
    "Key",
)


def _meant_as_shape(text: str) -> bool:
    """A string annotation that was meant as a shape: a jaxtyping subscript, or bare axes."""
    if any(
        f"{name}[" in text or f"{name}16[" in text or f"{name}32[" in text
        for name in _JAXTYPING_NAMES
    ):
        return True
    words = text.split()
    return len(words) > 1 and all(w.lstrip("*#_").replace("_", "").isalnum() for w in words)


def _bad_string(qualname: str, name: str, text: str, error: Exception) -> str:
    what = "the return annotation" if name == "return" else f"the annotation of {name}"
    first = first_line(error)
    if isinstance(error, SyntaxError) and "[" not in text:
        why, fix = (
            "SyntaxError",
            f'write Float[Tensor, "{text}"] (a bare string is not a shape contract)',
        )
    elif isinstance(error, NameError):
        why, fix = f"NameError: {first}", "import the names it uses at module level"
    else:
        why, fix = f"{type(error).__name__}: {first}", "fix the shape string"
    return f"{qualname}: {what}, {text!r}, cannot be read ({why}); {fix}"


def annotation_site(fn, name: str) -> str:
    """`file:line` of the annotation of parameter `name` ("return" for the return value), of
    the function's `def` when that annotation's line is unknown; "" without source."""
    filename, lines = annotation_lines(fn).get("", ("", {}))
    line = lines.get(name) or lines.get("def")
    return f"{_source.display_path(filename)}:{line}" if filename and line else ""


def annotation_lines(fn) -> dict:
    """{"": (filename, {param: line, "return": line, "def": line})} from the function's source."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return {}
    lines = {"def": code.co_firstlineno}
    try:
        source, start = inspect.getsourcelines(fn)
        tree = _source.parse("".join(_dedent(source)))
    except (OSError, TypeError, SyntaxError):
        return {"": (code.co_filename, lines)}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == fn.__name__:
            lines["def"] = start + node.lineno - 1
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None and arg.annotation is not None:
                    lines[arg.arg] = start + arg.annotation.lineno - 1
            if node.returns is not None:
                lines["return"] = start + node.returns.lineno - 1
            break
    return {"": (code.co_filename, lines)}


def _dedent(lines: list[str]) -> list[str]:
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[indent:] if x.strip() else "\n" for x in lines]
