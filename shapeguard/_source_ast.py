"""Reading the syntax of an expression site: what a node calls, on what and with which
arguments, the names its value is assigned to, and the short labels messages give
operands (`self.mask` -> `mask`, `K.transpose(-2, -1)` -> `K^T`). Pure functions of
the tree: `_source` parses, caches and finds the site."""

import ast
import functools

# Keyed by (lineno, col, end_lineno, end_col): the ends are None where Python has none.
NodeIndex = dict[tuple[int, int, int | None, int | None], tuple[ast.AST, tuple[str, ...], bool]]


_OP_NODES = (ast.Call, ast.BinOp, ast.Compare, ast.Subscript, ast.UnaryOp, ast.Attribute)


def index_tree(tree: ast.AST, index: NodeIndex) -> None:
    spine_targets: dict[int, tuple[str, ...]] = {}
    returned: set[int] = set()
    ops = []
    for node in _nodes(tree):
        if isinstance(node, _OP_NODES):
            ops.append(node)
        elif isinstance(node, ast.stmt):
            value, targets = _statement_value(node)
            if value is not None:
                for part in _spine(value):
                    spine_targets[id(part)] = targets
                    if isinstance(node, ast.Return):
                        returned.add(id(part))
    for node in ops:
        if getattr(node, "end_lineno", None) is not None:
            key = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
            index.setdefault(key, (node, spine_targets.get(id(node), ()), id(node) in returned))


def _nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of `tree`, each before the nodes inside it (`ast.walk`'s nodes in one
    loop, without a generator per node: indexing is most of a new file's first trace)."""
    found: list[ast.AST] = []
    todo = [tree]
    pop, push, extend, add = todo.pop, todo.append, todo.extend, found.append
    node_type, sequence = ast.AST, list
    while todo:
        node = pop()
        add(node)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                push(value)
            elif isinstance(value, sequence):
                extend([v for v in value if isinstance(v, node_type)])
    return found


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


def describe_node(node: ast.AST) -> tuple[str, str, tuple[str, ...]]:
    if isinstance(node, ast.Call):
        args = tuple(ast.unparse(a) for a in node.args)
        if isinstance(node.func, ast.Attribute):
            receiver = "" if _is_namespace(node.func.value) else _receiver(node.func.value)
            return node.func.attr, receiver, args
        return ast.unparse(node.func), "", args
    if isinstance(node, ast.BinOp):
        symbol = _BINOP_SYMBOLS.get(type(node.op), type(node.op).__name__)
        return symbol, "", (ast.unparse(node.left), ast.unparse(node.right))
    if isinstance(node, ast.Compare):
        return "compare", "", (ast.unparse(node.left), *map(ast.unparse, node.comparators))
    if isinstance(node, ast.Attribute):
        return node.attr, _receiver(node.value), ()
    if isinstance(node, ast.Subscript):
        return "__getitem__", _receiver(node.value), (ast.unparse(node.slice),)
    return "", "", ()


# Expressions that bind more loosely than `.attr`, `[i]` and `(args)`: as a receiver they
# stood in parentheses, which `ast.unparse` drops at the top of what it prints.
_LOOSE = (
    ast.BinOp,
    ast.BoolOp,
    ast.Compare,
    ast.UnaryOp,
    ast.IfExp,
    ast.Lambda,
    ast.NamedExpr,
    ast.Await,
)


def _receiver(node: ast.AST) -> str:
    """The receiver of a method call, attribute or subscript as the user wrote it: with
    the parentheses that make `(attn @ v).reshape(...)` reshape the product, so a message
    that prints `receiver.reshape(...)` keeps its meaning."""
    text = ast.unparse(node)
    return f"({text})" if isinstance(node, _LOOSE) else text


def _label(node: ast.AST) -> str:
    return short_label(ast.unparse(node))


_TRANSPOSE_SUFFIXES = (".transpose(-2, -1)", ".transpose(-1, -2)", ".mT", ".T", ".t()")


@functools.lru_cache(maxsize=4096)  # a pure function of the text: a few labels per op
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
