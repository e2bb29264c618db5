"""Where in the user's code an op was called, and what the user called its operands.

The user's frame is the first one outside torch and shapeguard. Its exact
expression comes from the code positions of the instruction being executed
(`co_positions`), not from `f_lineno`, which on Python 3.11 points at the start
of a multi-line statement and misled other tools. The file is parsed once and
every expression site is cached, so the cost after the first call is a lookup.
"""

import ast
import dataclasses
import functools
import importlib.util
import linecache
import os
import sys
import threading
import typing
from dataclasses import dataclass
from types import CodeType, FrameType

# CPython 3.11 keeps the AST constructor's recursion depth in state shared by threads:
# two threads parsing at once can fail with "SystemError: AST constructor recursion depth
# mismatch" (cpython gh-106905). Our parses take turns; a parse by the user's own code in
# another thread can still collide, so that one error is retried once.
_parse_lock = threading.Lock()


@typing.overload
def parse(text: str, mode: typing.Literal["exec"] = "exec") -> ast.Module: ...
@typing.overload
def parse(text: str, mode: typing.Literal["eval"]) -> ast.Expression: ...
def parse(text: str, mode: str = "exec") -> ast.AST:
    """`ast.parse`, safe to call from several threads at once."""
    with _parse_lock:
        try:
            return ast.parse(text, mode=mode)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error):
                raise
            return ast.parse(text, mode=mode)


# einops calls torch from its own backend: the user's line is the rearrange call.
_SKIP_PACKAGES = ("torch", "jaxtyping", "beartype", "typing_extensions", "shapeguard", "einops")


@functools.lru_cache(maxsize=1)
def _skip_dirs() -> tuple[str, ...]:
    """Folders of the packages whose frames are never the user's: found without importing them."""
    dirs = []
    for name in _SKIP_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin:
            continue
        # A package is skipped by folder; a single-module distribution by its own file.
        is_package = bool(spec.submodule_search_locations)
        dirs.append(os.path.dirname(spec.origin) + os.sep if is_package else spec.origin)
    return tuple(dirs)


def _is_internal(filename: str) -> bool:
    return filename.startswith(_skip_dirs()) or filename.startswith("<frozen")


# Code of shapeguard's own runners of a model (the CLI's `run_traced`): the frames below
# them (click, the console script, pytest) are never the user's.
_FLOORS: set[CodeType] = set()


def stop_at(code: CodeType) -> None:
    """Never look for the user's frame below a frame running `code`."""
    _FLOORS.add(code)


@dataclass(frozen=True, slots=True)
class Site:
    """One expression in the user's source, as far as shapeguard needs it."""

    filename: str
    lineno: int
    source: str  # the stripped source line
    targets: tuple[str, ...] = ()  # assignment targets when this expression is the value
    callee: str = ""  # "matmul", "view", "W_q", "@", "+"
    receiver: str = ""  # "K" in K.transpose(-2, -1); "" for plain function calls
    args: tuple[str, ...] = ()  # operand expressions, left to right
    in_module: bool = False  # the op ran inside a module's forward called from this line
    scope: int = 0  # the first line of the function the expression is in
    keywords: tuple[tuple[str, str], ...] = ()  # keyword arguments of a call: (name, expression)
    returned: bool = False  # the expression is the value of a `return`

    @property
    def location(self) -> str:
        return f"{display_path(self.filename)}:{self.lineno}"


# The site of an op torch.distributed called on its own (`user_site`): neither checked
# nor recorded.
PLUMBING = Site("<torch.distributed>", 0, "")


def display_path(filename: str) -> str:
    """The path relative to the working directory when it is below it, else as it is."""
    return _display_path(filename, os.getcwd())


@functools.lru_cache(maxsize=1024)
def _display_path(filename: str, cwd: str) -> str:
    # Keyed by the working directory too: after os.chdir the same file reads differently.
    try:
        rel = os.path.relpath(filename, cwd)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


# Frames of torch's own nn.Module forwards: an op there ran inside a module the user called.
_TORCH_MODULES = os.sep + os.path.join("torch", "nn", "modules") + os.sep
# Frames of torch.distributed (DTensor's from_local/to_local/redistribute, functional
# collectives, FSDP's unshard): an op there is distributed plumbing, not the user's.
_TORCH_DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep


def user_frame() -> FrameType | None:
    """The innermost frame on the current stack that is the user's."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename):
            return frame
        if frame.f_code in _FLOORS:
            return None
        frame = frame.f_back
    return None


def function_node(filename: str, scope: int) -> ast.AST | None:
    """The function (or lambda) of `filename` that starts at line `scope`."""
    key = (filename, scope)
    if key in _functions:
        return _functions[key]
    found = None
    lines = linecache.getlines(filename)
    try:
        tree = parse("".join(lines)) if lines else None
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if scope in (node.lineno, first):
                    found = node
                    break
    if len(_functions) > 4096:
        _functions.clear()
    _functions[key] = found
    return found


_functions: dict[tuple[str, int], ast.AST | None] = {}


def user_site() -> Site | None:
    """The site of the innermost user frame on the current stack."""
    frame: FrameType | None = sys._getframe(1)
    in_module = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_internal(filename):
            site = _site_for(frame.f_code, frame.f_lasti, in_module)
            return _named_by_caller(frame, site) if site.returned else site
        if frame.f_code in _FLOORS:
            return None
        if not in_module and _TORCH_MODULES in filename:
            in_module = True
        frame = frame.f_back
    return None


def op_site() -> Site | None:
    """`user_site` for an intercepted op: `PLUMBING` when torch.distributed called it on
    the way from the user's frame (DTensor's from_local and redistribute, collectives,
    FSDP's unshard), so the session neither checks nor records it."""
    frame: FrameType | None = sys._getframe(1)
    in_module = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_internal(filename):
            site = _site_for(frame.f_code, frame.f_lasti, in_module)
            return _named_by_caller(frame, site) if site.returned else site
        if frame.f_code in _FLOORS:
            return None
        if _TORCH_DISTRIBUTED in filename:
            return PLUMBING
        if not in_module and _TORCH_MODULES in filename:
            in_module = True
        frame = frame.f_back
    return None


_site_cache: dict[tuple[str, CodeType, int, bool], Site] = {}


def _named_by_caller(frame: FrameType, site: Site, depth: int = 0) -> Site:
    """A helper's returned value named as its caller names it: `Q = self.split_heads(x)`
    names what `split_heads` returns `Q`, not `output` (a module's forward is not a
    helper: torch calls it)."""
    caller = frame.f_back
    if caller is None or depth > 3 or _is_internal(caller.f_code.co_filename):
        return site
    outer = _site_for(caller.f_code, caller.f_lasti, False)
    if outer.callee != frame.f_code.co_name or not outer.targets:
        return site
    if outer.returned:
        outer = _named_by_caller(caller, outer, depth + 1)
        if outer.returned:
            return site
    return dataclasses.replace(site, targets=outer.targets, returned=False)


def _site_for(code: CodeType, lasti: int, in_module: bool) -> Site:
    # Code objects compare equal across files (co_filename is not compared), so the
    # same function in two files would share a site: the filename is part of the key.
    key = (code.co_filename, code, lasti, in_module)
    site = _site_cache.get(key)
    if site is None:
        site = _build_site(code, lasti, in_module)
        if len(_site_cache) > 50_000:  # notebooks re-create code objects; keep the cache bounded
            _site_cache.clear()
        _site_cache[key] = site
    return site


def _build_site(code: CodeType, lasti: int, in_module: bool) -> Site:
    filename = code.co_filename
    positions = list(code.co_positions())
    index = lasti // 2
    lineno, end_lineno, col, end_col = (
        positions[index] if 0 <= index < len(positions) else (None, None, None, None)
    )
    if lineno is None:
        lineno = code.co_firstlineno
    source = linecache.getline(filename, lineno).strip()
    node_index = _file_index(filename)
    if node_index is None or col is None:
        return Site(filename, lineno, source, in_module=in_module, scope=code.co_firstlineno)
    found = node_index.get((lineno, col, end_lineno, end_col))
    if found is None:
        return Site(filename, lineno, source, in_module=in_module, scope=code.co_firstlineno)
    node, targets, returned = found
    callee, receiver, args = _describe(node)
    keywords = (
        tuple((k.arg, ast.unparse(k.value)) for k in node.keywords if k.arg)
        if isinstance(node, ast.Call)
        else ()
    )
    return Site(
        filename,
        lineno,
        source,
        targets,
        callee,
        receiver,
        args,
        in_module,
        code.co_firstlineno,
        keywords,
        returned,
    )


# Keyed by (lineno, col, end_lineno, end_col): the ends are None where Python has none.
_NodeIndex = dict[tuple[int, int, int | None, int | None], tuple[ast.AST, tuple[str, ...], bool]]
_file_cache: dict[str, _NodeIndex | None] = {}


def _file_index(filename: str) -> _NodeIndex | None:
    if filename in _file_cache:
        return _file_cache[filename]
    lines = linecache.getlines(filename)
    index: _NodeIndex | None
    try:
        tree = parse("".join(lines)) if lines else None
    except (SyntaxError, ValueError):
        tree = None
    if tree is None:
        index = None
    else:
        index = {}
        _index_tree(tree, index)
    _file_cache[filename] = index
    return index


_OP_NODES = (ast.Call, ast.BinOp, ast.Compare, ast.Subscript, ast.UnaryOp, ast.Attribute)


def _index_tree(tree: ast.AST, index: _NodeIndex) -> None:
    spine_targets: dict[int, tuple[str, ...]] = {}
    returned: set[int] = set()
    for stmt in ast.walk(tree):
        value, targets = _statement_value(stmt)
        if value is not None:
            for node in _spine(value):
                spine_targets[id(node)] = targets
                if isinstance(stmt, ast.Return):
                    returned.add(id(node))
    for node in ast.walk(tree):
        if isinstance(node, _OP_NODES) and getattr(node, "end_lineno", None) is not None:
            key = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
            index.setdefault(key, (node, spine_targets.get(id(node), ()), id(node) in returned))


def _statement_value(stmt: ast.AST) -> tuple[ast.AST | None, tuple[str, ...]]:
    if isinstance(stmt, ast.Assign):
        target = stmt.targets[-1]
        if isinstance(target, ast.Tuple | ast.List):
            return stmt.value, tuple(_label(t) for t in target.elts)
        return stmt.value, (_label(target),)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign) and stmt.value is not None:
        return stmt.value, (_label(stmt.target),)
    if isinstance(stmt, ast.Return) and stmt.value is not None:
        return stmt.value, ("output",)
    return None, ()


def _spine(value: ast.AST):
    """The expressions whose result becomes the assigned value: a method chain, the
    first argument of a wrapping call, the left side of a scaling."""
    node: ast.AST | None = value
    while node is not None:
        yield node
        if isinstance(node, ast.Call):
            func = node.func
            # `self.proj(x)` calls a submodule: the value flows from x, not from self.
            on_self = isinstance(func, ast.Attribute) and _is_self(func.value)
            if isinstance(func, ast.Attribute) and not _is_namespace(func.value) and not on_self:
                node = func.value
            elif node.args:
                node = node.args[0]
            else:
                node = None
        elif isinstance(node, ast.BinOp):
            node = node.left
        elif isinstance(node, ast.Subscript | ast.Attribute):
            node = node.value
        else:
            node = None


_NAMESPACES = {"torch", "F", "nn", "functional", "math", "np", "einops"}


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _is_namespace(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _NAMESPACES
    if isinstance(node, ast.Attribute):
        return _is_namespace(node.value)
    return False


_BINOP_SYMBOLS = {
    ast.MatMult: "@",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
}


def _describe(node: ast.AST) -> tuple[str, str, tuple[str, ...]]:
    if isinstance(node, ast.Call):
        args = tuple(ast.unparse(a) for a in node.args)
        if isinstance(node.func, ast.Attribute):
            receiver = "" if _is_namespace(node.func.value) else ast.unparse(node.func.value)
            return node.func.attr, receiver, args
        return ast.unparse(node.func), "", args
    if isinstance(node, ast.BinOp):
        symbol = _BINOP_SYMBOLS.get(type(node.op), type(node.op).__name__)
        return symbol, "", (ast.unparse(node.left), ast.unparse(node.right))
    if isinstance(node, ast.Compare):
        return "compare", "", (ast.unparse(node.left), *map(ast.unparse, node.comparators))
    if isinstance(node, ast.Attribute):
        return node.attr, ast.unparse(node.value), ()
    if isinstance(node, ast.Subscript):
        return "__getitem__", ast.unparse(node.value), (ast.unparse(node.slice),)
    return "", "", ()


def _label(node: ast.AST) -> str:
    return short_label(ast.unparse(node))


_TRANSPOSE_SUFFIXES = (".transpose(-2, -1)", ".transpose(-1, -2)", ".mT", ".T", ".t()")


def short_label(expr: str) -> str:
    """A readable name for an operand expression: `self.mask` -> `mask`, `K.transpose(-2, -1)` -> `K^T`."""
    expr = expr.strip()
    for suffix in _TRANSPOSE_SUFFIXES:
        if expr.endswith(suffix):
            return short_label(expr[: -len(suffix)]) + "^T"
    if expr.startswith("self."):
        expr = expr[len("self.") :]
    if expr.replace(".", "").replace("_", "").isalnum() and "." in expr:
        expr = expr.rsplit(".", 1)[1]
    return expr if len(expr) <= 40 else expr[:37] + "..."


def sequence_items(expr: str) -> list[str] | None:
    """The element expressions of a list or tuple literal: `[a, b[:, :1]]` -> `a`, `b[:, :1]`."""
    try:
        node = parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.List | ast.Tuple):
        return [short_label(ast.unparse(e)) for e in node.elts]
    return None
