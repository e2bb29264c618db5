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
import inspect
import linecache
import os
import sys
import threading
import tokenize
import typing
from dataclasses import dataclass
from types import CodeType, FrameType

from ._memo import Memo
from ._source_ast import NodeIndex, describe_node, index_tree, short_label

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


def is_internal(filename: str) -> bool:
    """Whether a frame in `filename` is never the user's: shapeguard, the stdlib, torch and
    the other installed packages it skips, or frozen import machinery."""
    return filename.startswith(_skip_dirs()) or filename.startswith("<frozen")


# Code of shapeguard's own runners of a model (the CLI's `run_traced`): the frames below
# them (click, the console script, pytest) are never the user's.
_FLOORS: set[CodeType] = set()


def stop_at(code: CodeType) -> None:
    """Never look for the user's frame below a frame running `code`."""
    _FLOORS.add(code)
    _kinds.pop(id(code), None)  # classified again, as a floor


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
# The site of an op torch.optim made itself (an optimizer's step, a scheduler): run as it
# is, neither checked nor recorded (`op_site`).
OPTIMIZER = Site("<torch.optim>", 0, "")


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
TORCH_MODULES = os.sep + os.path.join("torch", "nn", "modules") + os.sep
# Frames of torch.distributed (DTensor's from_local/to_local/redistribute, functional
# collectives, FSDP's unshard): an op there is distributed plumbing, not the user's.
_TORCH_DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep
# Frames of torch.optim: a step updates each parameter and its state in place, a dozen
# elementwise ops per parameter that are no part of the model's dataflow (a training
# step's trace would be mostly these, all at the `optimizer.step()` line).
_TORCH_OPTIM = os.sep + os.path.join("torch", "optim") + os.sep


# What each code object on the stack is, by id (the entry keeps the code alive, so the id
# is not reused): the user's (0), internal (1), internal and an nn.Module's forward (2), a
# floor (3: see `stop_at`), torch.distributed's (4) or torch.optim's (5: see `op_site`). Keyed by id because code objects compare (and hash) by
# content: two files may hold equal ones, and hashing a code object hashes its constants.
# Bounded by the code objects a process runs through (a notebook makes new ones per cell).
_kinds = Memo("code kinds", 20_000)
_INTERNAL, _IN_MODULE, _FLOOR, _DISTRIBUTED, _OPTIMIZER = 1, 2, 3, 4, 5


def _kind(code: CodeType) -> int:
    entry = _kinds.get(id(code))
    if entry is not None and entry[0] is code:
        return entry[1]
    filename = code.co_filename
    if not is_internal(filename):
        kind = 0
    elif code in _FLOORS:
        kind = _FLOOR
    elif TORCH_MODULES in filename:
        kind = _IN_MODULE
    elif _TORCH_DISTRIBUTED in filename:
        kind = _DISTRIBUTED
    else:
        kind = _OPTIMIZER if _TORCH_OPTIM in filename else _INTERNAL
    return _kinds.hold(id(code), code, kind)


def user_code_position() -> tuple[int, int] | None:
    """(id of the code object, instruction) of the innermost user frame: a line's key
    without reading its source."""
    frame = user_frame()
    return (id(frame.f_code), frame.f_lasti) if frame is not None else None


def user_frame() -> FrameType | None:
    """The innermost frame on the current stack that is the user's."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        kind = _kind(frame.f_code)
        if not kind:
            return frame
        if kind == _FLOOR:
            return None
        frame = frame.f_back
    return None


def function_node(filename: str, scope: int) -> ast.AST | None:
    """The function (or lambda) of `filename` that starts at line `scope`."""
    tree = _tree(filename, scope)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if scope in (node.lineno, first):
                return node
    return None


# -- what is parsed: the function around a site, not the file ---------------------------------
# (filename, first line) -> [the file's stamp, the parsed block or None, its index or None];
# the stamp (size and modification time) drops what a file that changed on disk had. Kept
# for the most recently used blocks only: a parsed block is a few hundred objects that
# every full collection of the garbage collector walks, and once a function's sites are
# built (`_site_cache`, strings only) its tree is read again only for a site not seen yet.
_TREES_KEPT = 64
_trees = Memo("parsed blocks", _TREES_KEPT, drop="oldest")
# filename -> its stamp when last read; a file not in it is checked against linecache on
# its next read, so dropping entries (a process that reads more files than this) is safe.
_stamps = Memo("file stamps", 4096)


def _stamp(filename: str) -> tuple | None:
    try:
        st = os.stat(filename)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def _fresh_lines(filename: str) -> tuple[tuple | None, list[str]]:
    """The file's stamp and lines, re-read when the file changed since last read."""
    stamp = _stamp(filename)
    if _stamps.get(filename) != stamp:
        linecache.checkcache(filename)
        _stamps.put(filename, stamp)
    return stamp, linecache.getlines(filename)


def _tree(filename: str, first: int, code: CodeType | None = None) -> ast.AST | None:
    """The AST of the function (or class) whose code starts at line `first` (0: the whole
    file), with the file's own line numbers: parsing a big file whole would cost more
    than the ops of its first trace. `code`, the function's code object, tells where its
    block ends without tokenizing the file."""
    return _entry(filename, first, code)[1]


def _entry(filename: str, first: int, code: CodeType | None = None) -> list:
    """The cache entry of a block, [stamp, tree, index], parsed now if not kept."""
    stamp, lines = _fresh_lines(filename)
    key = (filename, first)
    cached = _trees.pop(key, None)
    if cached is None or cached[0] != stamp:
        tree = _parse_block(lines, first, code) if first else None
        if tree is None:
            tree = _parse(lines, 0)
        cached = [stamp, tree, None]
    return _trees.put(key, cached)  # (re)put last: the most recently used


def _parse(lines: list[str], offset: int, header: bool = False) -> ast.AST | None:
    """`lines` parsed as if they started at line `offset` + 1 (blank lines in front: the
    parser skips them in C, where renumbering the tree would walk every node)."""
    if not lines:
        return None
    try:
        tree = parse("\n" * offset + ("class _:\n" if header else "") + "".join(lines))
    except (SyntaxError, ValueError):
        return None
    return tree


def _parse_block(lines: list[str], first: int, code: CodeType | None = None) -> ast.AST | None:
    """The `def` (with its decorators) or `class` that starts at line `first`."""
    start = first - 1
    if not 0 <= start < len(lines):
        return None
    head = lines[start].lstrip()
    if not head.startswith(("def ", "async ", "@", "class ")):
        return None  # a lambda, a comprehension, module code: the whole file
    indented = lines[start][:1].isspace()
    # An indented method parses under a dummy header line, the line before its own.
    offset = start - 1 if indented else start
    if code is not None:
        tree = _parse(lines[start : _block_end(lines, start, code)], offset, header=indented)
        if tree is not None:
            return tree
    try:
        block = inspect.getblock(lines[start:])  # tokenizes: the slow way
    except (IndexError, SyntaxError, tokenize.TokenError):
        return None
    return _parse(block, offset, header=indented)


def _block_end(lines: list[str], start: int, code: CodeType) -> int:
    """The index past the last line of the block that starts at `lines[start]`: the last
    line any instruction of `code` (or of code nested in it) spans, then the lines after
    it that are blank, comments or indented deeper than the block's first line (a
    trailing `pass`, which has no instruction). A guess that cuts a statement fails to
    parse, and `_parse_block` tokenizes instead."""
    last = _last_line(code)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = max(last, start + 1)
    while end < len(lines):
        line = lines[end]
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#") and len(line) - len(stripped) <= indent:
            break
        end += 1
    return end


def _last_line(code: CodeType) -> int:
    last = code.co_firstlineno
    for _, end, _, _ in code.co_positions():
        if end is not None and end > last:
            last = end
    for const in code.co_consts:
        if isinstance(const, CodeType):
            last = max(last, _last_line(const))
    return last


def forget(filename: str) -> None:
    """Drop what was parsed of a file (a file rewritten in place with the same size and
    time stamp: rare, but a test can do it)."""
    for key in [k for k in _trees if k[0] == filename]:
        _trees.pop(key)
    _stamps.pop(filename, None)
    linecache.checkcache(filename)


def user_site() -> Site | None:
    """The site of the innermost user frame on the current stack."""
    return _innermost_site(sys._getframe(1), plumbing=False)


def op_site() -> Site | None:
    """`user_site` for an intercepted op: `PLUMBING` when torch.distributed called it on
    the way from the user's frame (DTensor's from_local and redistribute, collectives,
    FSDP's unshard), `OPTIMIZER` when torch.optim did (an optimizer's step), so the session
    neither checks nor records it. Not an op inside a module that torch.optim calls
    (swa_utils' AveragedModel runs the model): the model's ops are the model's."""
    return _innermost_site(sys._getframe(1), plumbing=True)


def _innermost_site(frame: FrameType | None, *, plumbing: bool) -> Site | None:
    in_module = False
    kind_of = _kinds.get  # a local call per frame: the cheapest lookup Python has
    while frame is not None:
        code = frame.f_code
        entry = kind_of(id(code))
        kind = entry[1] if entry is not None and entry[0] is code else _kind(code)
        if not kind:
            lasti = frame.f_lasti
            cached = _site_cache.get((id(code), lasti, in_module))
            if cached is not None and cached[0] is code:
                site = cached[1]
            else:
                site = site_at(code, lasti, in_module)
            # Named by the caller's line, which differs from call to call: never cached.
            return _named_by_caller(frame, site) if site.returned else site
        if kind == _FLOOR:
            return None
        if kind == _DISTRIBUTED and plumbing:
            return PLUMBING
        if kind == _OPTIMIZER and plumbing and not in_module:
            return OPTIMIZER
        if kind == _IN_MODULE:
            in_module = True
        frame = frame.f_back
    return None


def op_frame(frame: FrameType | None) -> tuple[FrameType | None, bool] | None:
    """The user's frame of an op called from `frame`, and whether the op ran inside a
    module's forward called from it: the walk `op_site` makes, without the site (a replay
    makes that only where the frame is not where a step's site was last seen: `site_key`).
    (None, False) past a floor or off the stack; None where torch.optim called the op
    outside a module (`OPTIMIZER`). torch.distributed's frames are walked through."""
    in_module = False
    kind_of = _kinds.get  # a local call per frame: the cheapest lookup Python has
    while frame is not None:
        code = frame.f_code
        entry = kind_of(id(code))
        kind = entry[1] if entry is not None and entry[0] is code else _kind(code)
        if not kind:
            return frame, in_module
        if kind == _FLOOR:
            return None, False
        if kind == _OPTIMIZER and not in_module:
            return None
        if kind == _IN_MODULE:
            in_module = True
        frame = frame.f_back
    return None, False


def frame_site(frame: FrameType, in_module: bool) -> Site:
    """The site of `frame`, a user frame (`in_module`: the op ran inside a module's forward
    called from it), as `user_site` makes it."""
    code = frame.f_code
    lasti = frame.f_lasti
    cached = _site_cache.get((id(code), lasti, in_module))
    site = (
        cached[1] if cached is not None and cached[0] is code else site_at(code, lasti, in_module)
    )
    return _named_by_caller(frame, site) if site.returned else site


def site_key(code: CodeType, lasti: int, in_module: bool, site: Site) -> tuple | None:
    """A key for `site`, the `frame_site` of a frame at this code position: (code,
    instruction, in a module, `site_epoch`), which gives this very site as long as the
    epoch holds; None where the site is named by the caller's line (it may differ)."""
    cached = _site_cache.get((id(code), lasti, in_module))
    if cached is None or cached[0] is not code or cached[1] is not site:
        return None
    return (code, lasti, in_module, site_epoch[0])


# Sites by (id of the code object, instruction, in a module); the entry keeps the code.
site_epoch = [0]  # counts the clears of `_site_cache` (`site_key`)


def _next_epoch() -> None:
    site_epoch[0] += 1  # the keys `site_key` gave name sites no longer cached


# Bounded: notebooks re-create code objects, each with new sites.
_site_cache = Memo("sites", 50_000, on_clear=_next_epoch)


def _named_by_caller(frame: FrameType, site: Site, depth: int = 0) -> Site:
    """A helper's returned value named as its caller names it: `Q = self.split_heads(x)`
    names what `split_heads` returns `Q`, not `output` (a module's forward is not a
    helper: torch calls it)."""
    caller = frame.f_back
    if caller is None or depth > 3 or _kind(caller.f_code):
        return site
    outer = site_at(caller.f_code, caller.f_lasti, False)
    if outer.callee != frame.f_code.co_name or not outer.targets:
        return site
    if outer.returned:
        outer = _named_by_caller(caller, outer, depth + 1)
        if outer.returned:
            return site
    return _renamed(site, outer.targets)


# (id of a site, the caller's targets) -> (the site, it named so): one object per naming, so
# that a replay, which compares sites by identity, sees the same site on every call.
_renamed_cache = Memo("renamed sites", 50_000)  # as many as `_site_cache` holds sites


def _renamed(site: Site, targets: tuple[str, ...]) -> Site:
    key = (id(site), targets)
    renamed = _renamed_cache.held(key, site)
    if renamed is None:
        renamed = dataclasses.replace(site, targets=targets, returned=False)
        _renamed_cache.hold(key, site, renamed)
    return renamed


def site_at(code: CodeType, lasti: int, in_module: bool) -> Site:
    """The site (file, line, source, names) of instruction `lasti` of `code`, cached per
    code object; for callers that walk frames or tracebacks themselves."""
    key = (id(code), lasti, in_module)
    entry = _site_cache.get(key)
    if entry is not None and entry[0] is code:
        return entry[1]
    return _site_cache.hold(key, code, _build_site(code, lasti, in_module))


def _build_site(code: CodeType, lasti: int, in_module: bool) -> Site:
    filename = code.co_filename
    positions = list(code.co_positions())
    index = lasti // 2
    lineno, end_lineno, col, end_col = (
        positions[index] if 0 <= index < len(positions) else (None, None, None, None)
    )
    if lineno is None:
        lineno = code.co_firstlineno
    _fresh_lines(filename)  # a file that changed on disk is read again
    source = linecache.getline(filename, lineno).strip()
    node_index = _code_index(code)
    if node_index is None or col is None:
        return Site(filename, lineno, source, in_module=in_module, scope=code.co_firstlineno)
    found = node_index.get((lineno, col, end_lineno, end_col))
    if found is None:
        return Site(filename, lineno, source, in_module=in_module, scope=code.co_firstlineno)
    node, targets, returned = found
    callee, receiver, args = describe_node(node)
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


def _code_index(code: CodeType) -> NodeIndex | None:
    """The expression sites of the function `code` belongs to (indexed once per parse, when
    a site first needs it, and kept with the tree)."""
    first = 0 if code.co_name.startswith("<") else code.co_firstlineno
    entry = _entry(code.co_filename, first, code)
    tree, index = entry[1], entry[2]
    if tree is None:
        return None
    if index is None:
        index = entry[2] = {}
        index_tree(tree, index)
    return index


def _file_index(filename: str) -> NodeIndex | None:
    """Every expression site of a file (the whole file parsed)."""
    tree = _tree(filename, 0)
    if tree is None:
        return None
    index: NodeIndex = {}
    index_tree(tree, index)
    return index


def sequence_items(expr: str) -> list[str] | None:
    """The element expressions of a list or tuple literal: `[a, b[:, :1]]` -> `a`, `b[:, :1]`."""
    try:
        node = parse(expr, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.List | ast.Tuple):
        return [short_label(ast.unparse(e)) for e in node.elts]
    return None
