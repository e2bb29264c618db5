"""The package's imports run one way: vocabulary, checks, trace, what builds on the
trace, then the command line and the plugin. Lazy imports (inside functions) count:
a cycle hidden in a function is still a cycle."""

import ast
import pathlib

from package_source import parsed

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shapeguard"

# Lowest first. A module belongs to the first entry it is, or is inside.
LAYERS = {
    # errors, the off switch, the op table, naming, source lines, the reporting path, what
    # every layer asks of a value (is it a tensor, its dtype's name), the bounded memo tables
    "vocabulary": (
        "shapeguard._version", "shapeguard._errors", "shapeguard._config", "shapeguard._ops",
        "shapeguard._names", "shapeguard._source", "shapeguard._source_ast", "shapeguard._suppress",
        "shapeguard._reporting", "shapeguard._ranks", "shapeguard._values", "shapeguard._memo",
    ),
    # rules on the op table; the DTensor reader they use; the attention reach they compute
    "checks": ("shapeguard.checks", "shapeguard._tp", "shapeguard._reach"),
    # the interceptor, the session, the records; shapeguard.attention dispatches through it
    "trace": ("shapeguard._trace", "shapeguard.attention"),
    "on the trace": (
        "shapeguard.report", "shapeguard._public_trace", "shapeguard._contract",
        "shapeguard.contracts", "shapeguard._guard", "shapeguard._compiled", "shapeguard._probes",
        "shapeguard._explain", "shapeguard.distributed", "shapeguard._merge", "shapeguard._diff",
        "shapeguard._cli.check_summary",  # rows of a report: read by the CLI only
    ),
    "top": ("shapeguard._cli", "shapeguard._plugin", "shapeguard.__main__", "shapeguard"),
}  # fmt: skip


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS.values()):
        # The package itself is only its __init__: a module it holds is placed on its own.
        if any(module == p or (p != "shapeguard" and module.startswith(p + ".")) for p in prefixes):
            return rank
    raise LookupError(module)


def imports_of(module: str) -> set[str]:
    """The package's modules that `module` imports, at the top or inside a function."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_has_a_layer():
    unplaced = []
    for module in MODULES:
        try:
            layer_of(module)
        except LookupError:
            unplaced.append(module)
    assert not unplaced, f"place these in LAYERS (tests/test_layers.py): {sorted(unplaced)}"


def test_imports_only_go_down():
    names = list(LAYERS)
    upward = sorted(
        f"{module} ({names[layer_of(module)]}) imports {target} ({names[layer_of(target)]})"
        for module, targets in GRAPH.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    )
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_the_vocabulary_imports_nothing_of_ours_above_it():
    vocabulary = [m for m in MODULES if layer_of(m) == 0]
    outside = sorted(f"{m} -> {t}" for m in vocabulary for t in GRAPH[m] if layer_of(t) != 0)
    assert not outside, outside


def test_no_import_cycle():
    """Tarjan's strongly connected components: any with two modules or more is a cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in GRAPH:
        if module not in index:
            visit(module)
    assert not cycles, f"import cycles: {cycles}"


def test_rules_read_the_call_through_its_view():
    """Rules get a read-only `CallView`: no rule reaches the session or a private part
    of the call (mypy checks the same in CI; this keeps it visible in the suite)."""
    reached = []
    for path in (PACKAGE / "checks").glob("*.py"):
        for node in ast.walk(parsed(path)):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            if node.value.id == "call" and (node.attr == "session" or node.attr.startswith("_")):
                reached.append(f"{path.name}:{node.lineno}: call.{node.attr}")
    assert not reached, reached


def test_sessions_open_in_one_place():
    """Every opener goes through `_trace/opening.py` (`recording_session()` or `begin()`), so a
    session is always entered and closed the same way."""
    openers = sorted(
        f"{module}:{node.lineno}"
        for module, path in MODULES.items()
        if module not in ("shapeguard._trace.opening", "shapeguard._trace.session")
        for node in ast.walk(parsed(path))
        if isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "open_session"
    )
    assert not openers, f"open a session with _trace.opening instead: {openers}"
