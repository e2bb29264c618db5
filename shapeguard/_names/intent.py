"""What the user's own code says an axis of a view is meant to be.

`q.view(B, self.n_heads, S, self.d_k)` names its target axes: `self.n_heads` is the
module's head count, `S` came from `B, S, _ = x.shape`, so it is x's sequence
axis. Where sizes differ, provenance alone shows a wrong view (it cuts across
axes); where they coincide (seq == heads == 4) the view is legal and the data
lands on the wrong axis without a trace in the shapes. The user's names are then
the only witness, and a contradiction between them and provenance is the bug.

Only plain spellings are read: `self.<attribute>` for a declared size, a shape
read (`x.shape[1]`, `x.size(1)`, `B, S, _ = x.shape`), names assigned from those
in the same function, and products of them (`C * p * p`). Anything else has no
intent, and nothing is reported from it.
"""

import ast
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

from .. import _source
from .._memo import Memo
from .._values import is_tensor
from . import dims as D
from .axes import ATTRIBUTE_AXES
from .dims import FEATURE, Axis

_ATTRIBUTE_NAMES = {attr: axis for axis, attrs in ATTRIBUTE_AXES.items() for attr in attrs}
_DEPTH = 4


@dataclass(frozen=True, slots=True)
class Intent:
    """What one target size of a view stands for."""

    text: str  # the user's expression: "self.n_heads", "h", "N"
    kind: str | None  # the kind the user means (a declared head count is a feature)
    name: str | None  # "heads", "d_k", "seq", ...
    axis: Axis | None = None  # for a shape read: the axis it was read from
    part: bool = False  # a factor of the size (`C` in `C * p * p`), not all of it


def view_intents(call, count: int, copies: bool = False) -> list[Intent | None]:
    """One entry per target size of the view `call` (None where the code says nothing);
    with `copies`, of the expand or repeat `call` (einops' repeat: its new letters)."""
    site = call.site
    if site is None:
        return []
    matches = call.site_matches()
    plan = _plan(site, matches, count, copies and call.op == "expand")
    if not plan:
        return []
    frame = None
    found: list[Intent | None] = []
    for step in plan:
        if step is None or isinstance(step, Intent):
            found.append(step)
            continue
        if frame is None:
            frame = _source.user_frame()
        found.append(_shape_intent(call, frame, *step))
    return found


def size_read(call, node: ast.AST, text: str) -> Intent | None:
    """What the expression `node` (written at the call's site, as `text`) reads: a shape
    read of a tensor in the user's frame (`N` of `N = x.shape[1]`), or None."""
    site = call.site
    if site is None:
        return None
    bindings = _aliases(site)
    read = _read(node, bindings, 0, site.lineno)
    if read is None or read[0] != "shape":
        return None
    _, tensor_name, index, part, line = read
    if part or any(line < b.line and b.end < site.lineno for b in bindings.get(tensor_name, ())):
        return None  # a factor of a size, or a name rebound since it was read
    return _shape_intent(call, _site_frame(site), text, tensor_name, index, part)


def _site_frame(site) -> FrameType | None:
    """The frame running the site's function (the innermost one), where its names are
    read: not merely the innermost user frame, which a wrapper around a rule can be."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_filename == site.filename and (
            code.co_firstlineno == site.scope or frame.f_lineno == site.lineno
        ):
            return frame
        frame = frame.f_back
    return None


def count_sources(call, count: int) -> list[Axis | None]:
    """For `repeat` and `expand`: per size argument, the axis the user read it from whole
    (`bsz` of `bsz, T, _ = h.size()`), or None."""
    return [
        intent.axis if intent is not None and not intent.part else None
        for intent in view_intents(call, count, copies=True)
    ]


def count_intents(call, count: int) -> list[Intent | None]:
    """For `repeat`, `expand` and `repeat_interleave`: what each count argument stands for.
    einops' `repeat` expands once, one count per letter of its right side, each bound by
    keyword (`repeat(mask, "b j -> (h b) () j", h=self.heads)`)."""
    site = call.site
    if site is not None and site.callee == "repeat" and call.op == "expand":
        if site.receiver not in ("", "einops") or site.in_module:
            return []
        plan = _plans.held(("copies", id(site), count), site)
        if plan is None:
            plan = _plans.hold(("copies", id(site), count), site, _copies_plan(site, count))
        # A count read off a shape (`b=B` after `B = x.shape[0]`) says more than a declared
        # one: it is the axis itself.
        read = view_intents(call, count, copies=True)
        if not read or not plan:
            return read or plan
        return [
            r if r is not None and r.axis is not None else p
            for r, p in zip(read, plan, strict=False)
        ]
    return view_intents(call, count, copies=True)


def _copies_plan(site, count: int) -> list[Intent | None]:
    letters = _right_letters(site)
    if letters is None or len(letters) != count:
        return []
    bound, bindings = dict(site.keywords), _aliases(site)
    plan: list[Intent | None] = []
    for letter in letters:
        read = None
        if letter in bound:
            try:
                node = _source.parse(bound[letter], mode="eval").body
            except SyntaxError:
                node = None
            read = _read(node, bindings, 0, site.lineno) if node is not None else None
        name = _ATTRIBUTE_NAMES.get(read[1]) if read is not None and read[0] == "attr" else None
        plan.append(Intent(bound[letter], FEATURE, name) if name else None)
    return plan


def _right_letters(site) -> list[str] | None:
    """The letters of an einops pattern's right side, groups and all, in order."""
    pattern = _einops_pattern(site)
    if pattern is None or pattern.count("->") != 1 or "..." in pattern:
        return None
    return pattern.split("->")[1].replace("(", " ").replace(")", " ").split()


def einops_patterns(site, name: str) -> list[str]:
    """The patterns of the einops `repeat` and `rearrange` calls assigned to `name` in the
    site's function before its line, in order (for a hint: which one is meant is not known)."""
    found = []
    for binding in _aliases(site).get(name, ()):
        value = binding.value
        if binding.end >= site.lineno or not isinstance(value, ast.Call) or len(value.args) < 2:
            continue
        callee = value.func.attr if isinstance(value.func, ast.Attribute) else None
        callee = value.func.id if isinstance(value.func, ast.Name) else callee
        pattern = value.args[1].value if isinstance(value.args[1], ast.Constant) else None
        if callee in ("repeat", "rearrange") and isinstance(pattern, str):
            found.append((binding.line, pattern))
    return [pattern for _, pattern in sorted(found)]


# What a site's text says of each target size, read once per (site, the call is the
# site's own, count): an Intent, None, or (text, tensor name, index, part) for a shape
# read, whose tensor is looked up in the frame of each call. Keyed by the site's id and
# holding the site, as `_source` keys its own: a file edited on disk makes new sites.
# Bounded by the view and repeat sites a process meets, a few per attention module.
_plans = Memo("view plans", 4096)


def _plan(site, matches: bool, count: int, expand: bool = False) -> list:
    key = (id(site), matches, count, expand)
    plan = _plans.held(key, site)
    if plan is None:
        plan = _plans.hold(key, site, _read_plan(site, matches, count, expand))
    return plan


def _read_plan(site, matches: bool, count: int, expand: bool) -> list:
    texts: Sequence[str | None]
    if site.callee in _EINOPS and not site.receiver and not site.in_module:
        texts = _einops_new_axes(site, count) if expand else _einops_texts(site, count)
    elif matches:
        texts = list(site.args)
        if len(site.args) == 1 and count > 1:
            texts = _source.sequence_items(site.args[0]) or []  # view((B, S, h, d))
    else:
        return []
    if len(texts) != count:
        return []
    bindings = _aliases(site)
    plan: list = []
    for text in texts:
        if text is None:
            plan.append(None)
            continue
        try:
            node = _source.parse(text, mode="eval").body
        except SyntaxError:
            plan.append(None)
            continue
        read = _read(node, bindings, 0, site.lineno)
        if read is None:
            plan.append(None)
            continue
        if read[0] == "attr":
            axis_name = _ATTRIBUTE_NAMES.get(read[1])
            if axis_name is None and read[1] in _CHANNEL_COUNTS:
                axis_name = "channels"
            plan.append(Intent(text, FEATURE, axis_name) if axis_name else None)
            continue
        _, tensor_name, index, part, line = read
        # The shape was read at `line`; the tensor now under that name is the one read only
        # if nothing was assigned to the name in between (q = q.transpose(1, 2) would be;
        # the view's own statement, `x = x.view(...)`, assigns after the view). Where it
        # was, a name the code bound to the same tensor and kept holds it (`x_in = x`).
        held_by = _still_holding(tensor_name, line, bindings, site.lineno)
        plan.append((text, held_by, index, part) if held_by is not None else None)
    return plan


# A module's declared count of channels (a conv block's, an image's): the features of a
# channels-first map, as `self.n_heads` declares the heads.
_CHANNEL_COUNTS = ("channels", "in_channels", "out_channels", "num_channels")


def _still_holding(name: str, line: int, bindings: dict, site_line: int) -> str | None:
    """A name that, at `site_line`, holds the tensor `name` held when its shape was read at
    `line`: `name` itself where nothing was assigned to it in between, else a plain alias
    (`x_in = x`, `residual = x`) made while `name` held that tensor and not rebound since
    (assigned on every path to the site). None where no name is known to hold it."""
    own = bindings.get(name, ())
    later = [b.line for b in own if line < b.line and b.end < site_line]
    if not later:
        return name
    rebound = min(later)
    for alias, candidates in bindings.items():
        binding = _binding(candidates, site_line)
        value = binding.value if binding is not None else None
        if not (isinstance(value, ast.Name) and value.id == name) or binding is None:
            continue
        if binding.end >= rebound:
            continue  # bound after `name` took another tensor
        # Between the alias and the read, `name` was not assigned: the same tensor.
        low, high = sorted((binding.line, line))
        if any(low < b.line and b.end < high for b in own):
            continue
        return alias
    return None


_EINOPS = ("rearrange", "repeat", "reduce")


def _einops_pattern(site) -> str | None:
    """The einops call's pattern, where the code spells it as a literal with an arrow."""
    if len(site.args) < 2:
        return None
    try:
        pattern = ast.literal_eval(site.args[1])
    except (ValueError, SyntaxError):
        return None
    return pattern if isinstance(pattern, str) and "->" in pattern else None


def _einops_texts(site, count: int) -> list[str | None]:
    """For the reshape einops makes first, `rearrange(t, "(h b) s d -> ...", h=self.n_heads)`,
    one axis per letter of the pattern's left side: the expression bound to the letter."""
    pattern = _einops_pattern(site)
    if pattern is None:
        return []
    left = pattern.split("->", 1)[0]
    if "..." in left or "(" not in left:
        return []  # no split of a group: einops makes no such reshape
    letters = left.replace("(", " ").replace(")", " ").split()
    if len(letters) != count:
        return []
    bound = dict(site.keywords)
    return [bound.get(letter) for letter in letters]


def _einops_new_axes(site, count: int) -> list[str | None]:
    """For the expand einops' repeat ends with, `repeat(t, "n d -> b n d", b=B)`, one
    axis per letter of the pattern's right side: the expression bound to each new letter."""
    pattern = _einops_pattern(site) if site.callee == "repeat" else None
    if pattern is None:
        return []
    left, right = pattern.split("->", 1)
    if "(" in right or "..." in right or len(right.split()) != count:
        return []  # a tiled group: einops repeats, and reshapes, not a plain expand
    old = set(left.replace("(", " ").replace(")", " ").split())
    bound = dict(site.keywords)
    return [None if letter in old else bound.get(letter) for letter in right.split()]


def _shape_intent(call, frame, text: str, tensor_name: str, index: int, part: bool):
    tensor = frame.f_locals.get(tensor_name) if frame is not None else None
    if not is_tensor(tensor) or not -tensor.dim() <= index < tensor.dim():
        return None
    axis = call.meta_of(tensor).dims[index]
    if not axis:
        return None
    return Intent(text, D.kind_of(axis), D.known_name(axis), axis, part)


def _read(node: ast.AST, bindings: dict, depth: int, line: int):
    """("attr", name) or ("shape", tensor, index, part, line read), or None. A name is read
    as its last assignment before `line` (the line being read), and that assignment's value
    as of its own line: what the name held when the code at `line` ran."""
    if depth > _DEPTH:
        return None
    if isinstance(node, ast.Attribute) and _is_self(node.value):
        return ("attr", node.attr)
    if isinstance(node, ast.Name):
        binding = _binding(bindings.get(node.id, ()), line)
        if binding is None or binding.value is None:
            return None
        if isinstance(binding.value, tuple):
            return binding.value
        return _read(binding.value, bindings, depth + 1, binding.line)
    shape = _shape_read(node)
    if shape is not None:
        return ("shape", *shape, False, getattr(node, "lineno", 0))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        reads = [_read(side, bindings, depth + 1, line) for side in (node.left, node.right)]
        shapes = [r for r in reads if r is not None and r[0] == "shape"]
        if len(shapes) == 1:
            _, tensor, index, _, read_line = shapes[0]
            return ("shape", tensor, index, True, read_line)
    return None


def _binding(candidates, line: int):
    """The assignment a read at `line` sees: the last one that ended before it, provided
    it runs on every path to the read (its block holds the read's line). One in a branch
    or loop the read is outside of may or may not have run: then nothing is known."""
    seen = None
    for binding in candidates:
        if binding.end < line and (seen is None or binding.line > seen.line):
            seen = binding
    if seen is None or not seen.block[0] <= line <= seen.block[1]:
        return None
    return seen


def _shape_read(node: ast.AST) -> tuple[str, int] | None:
    """`x.shape[i]` or `x.size(i)`: (x, i)."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "shape"
        and isinstance(node.value.value, ast.Name)
    ):
        index = _constant_int(node.slice)
        return (node.value.value.id, index) if index is not None else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "size"
        and isinstance(node.func.value, ast.Name)
        and len(node.args) == 1
    ):
        index = _constant_int(node.args[0])
        return (node.func.value.id, index) if index is not None else None
    return None


def _constant_int(node: ast.AST) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    return None


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


@dataclass(frozen=True, slots=True)
class _Binding:
    """One assignment to a name: its value (an ast node, a shape read, or None where it is
    not a plain assignment), its first and last lines, and the lines of the block it is in."""

    value: object
    line: int
    end: int
    block: tuple[int, int]


# (filename, scope) -> `_aliases`: its values are nodes of the function's tree, so only the
# latest functions are kept, as `_source` keeps its trees.
_ALIASES_KEPT = 64
_alias_cache = Memo("function assignments", _ALIASES_KEPT, drop="oldest")


def _aliases(site) -> dict:
    """The function's assignments, name -> every `_Binding` of it: a plain assignment keeps
    its value, `B, S, _ = x.shape` gives B the shape read ("shape", "x", 0, False, line),
    and any other assignment (`n += 1`, a loop's target) is known to be there only."""
    key = (site.filename, site.scope)
    found = _alias_cache.get(key)
    if found is not None:
        return found
    bindings: dict[str, list[_Binding]] = {}
    func = _source.function_node(site.filename, site.scope)
    if func is not None:
        for stmt, block in _statements(func):
            for node in _own_nodes(stmt):
                _bind(node, block, bindings)
    return _alias_cache.put(key, bindings)


def _statements(func: ast.AST):
    """Every statement of the function (nested ones too), with the lines of its block."""
    stack = [func]
    while stack:
        node = stack.pop()
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            stmts = [s for s in block if isinstance(s, ast.stmt)]
            span = (
                (stmts[0].lineno, max(s.end_lineno or s.lineno for s in stmts)) if stmts else None
            )
            for child in block:
                if span is not None and isinstance(child, ast.stmt):
                    yield child, span
                if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    stack.append(child)  # its own blocks; handlers and cases hold bodies


def _own_nodes(stmt: ast.stmt):
    """The statement and its expressions, not the statements nested in it (their own)."""
    stack: list[ast.AST] = [stmt]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.stmt | ast.excepthandler | ast.match_case)
        )


def _bind(node: ast.AST, block: tuple[int, int], bindings: dict) -> None:
    values: dict[str, object] = {}
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name):
            values[target.id] = value
        elif isinstance(target, ast.Tuple):
            _unpack(target, value, values)
    line = getattr(node, "lineno", 0)
    for target in _targets(node):
        # A loop's or a with's target is bound at its header, not when its body ends.
        header = isinstance(node, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith)
        end = getattr(target if header else node, "end_lineno", None) or line
        for name in _bound_names(target):
            binding = _Binding(values.get(name), line, end, block)
            bindings.setdefault(name, []).append(binding)


def _targets(node: ast.AST) -> list:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For | ast.AsyncFor):
        return [node.target]
    if isinstance(node, ast.With | ast.AsyncWith):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    if isinstance(node, ast.NamedExpr):
        return [node.target]
    return []


def _bound_names(target: ast.AST) -> list[str]:
    """The names an assignment target rebinds: `a`, `a, (b, *c)`; not the names read in
    `x[:n] = ...` or `self.k = ...`, which change an object and rebind nothing."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [name for item in target.elts for name in _bound_names(item)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _unpack(target: ast.Tuple, value: ast.expr, found: dict) -> None:
    names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
    if isinstance(value, ast.Tuple) and len(value.elts) == len(names):
        for name, item in zip(names, value.elts, strict=True):
            if name is not None:
                found[name] = item
        return
    tensor = None
    if (
        isinstance(value, ast.Attribute)
        and value.attr == "shape"
        and isinstance(value.value, ast.Name)
    ):
        tensor = value.value.id  # B, S, _ = x.shape
    elif (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "size"
        and not value.args
        and isinstance(value.func.value, ast.Name)
    ):
        tensor = value.func.value.id  # B, T, C = x.size()
    if tensor is not None:
        for index, name in enumerate(names):
            if name is not None and name != "_":
                found[name] = ("shape", tensor, index, False, value.lineno)
