"""The package stays a house a newcomer can live in: short modules, no code the engine writes
for itself without a check against the plain function it stands for, and no reaching into
another module's private names. Like the layer test (tests/test_layers.py), these read the
source, not the running package.

Each allow-list below holds what exists today, with its reason; an entry that no longer
matches fails its test too, so the lists only shrink.
"""

import ast
import pathlib
import re

from package_source import parsed

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shapeguard"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
TREES = {module: parsed(path) for module, path in MODULES.items()}


# -- (a) short modules --------------------------------------------------------------------
LONGEST = 600
# The phrase that admits a longer module: a line of its opening docstring starting with it.
LONG_BECAUSE = re.compile(r"^\s*Long because\b", re.M)
# Modules over LONGEST lines today whose docstring does not say why; they are being split.
ALLOWED_LONG: set[str] = set()


def lines_of(module: str) -> int:
    return len(MODULES[module].read_text().splitlines())


def says_why_it_is_long(module: str) -> bool:
    return bool(LONG_BECAUSE.search(ast.get_docstring(TREES[module]) or ""))


def test_no_module_is_long_without_saying_why():
    long = {m for m in MODULES if lines_of(m) > LONGEST and not says_why_it_is_long(m)}
    new = sorted(f"{m} ({lines_of(m)} lines)" for m in long - ALLOWED_LONG)
    assert not new, (
        f"modules over {LONGEST} lines: split them by concern, or start a line of the "
        f'opening docstring with "Long because" and the reason: {new}'
    )
    stale = sorted(ALLOWED_LONG - long)
    assert not stale, f"short now, or saying why (drop them from ALLOWED_LONG): {stale}"


def test_the_length_scan_reads_the_phrase_only_in_the_opening_docstring():
    said = ast.parse('"""Rows of a table.\n\nLong because the table is one concern."""\n')
    assert LONG_BECAUSE.search(ast.get_docstring(said))
    unsaid = ast.parse('"""Rows of a table."""\n# Long because of nothing.\n')
    assert not LONG_BECAUSE.search(ast.get_docstring(unsaid))


# -- (b) no code the engine generates for itself --------------------------------------------
# Calls of the builtins that run source text. A site is (module, enclosing function, builtin).
RUNS_SOURCE = frozenset({"exec", "eval", "compile"})
# Sites that run the user's code or evaluate the user's own annotations: not generated code.
USER_CODE: dict[tuple[str, str, str], str] = {
    ("shapeguard._cli.loader", "_compile", "compile"): "the user's file, for `shapeguard trace`",
    ("shapeguard._cli.loader", "_execute", "exec"): "the user's file, run as its own module",
    ("shapeguard._cli.inputs", "_Sizes._symbolic", "eval"): (
        "a symbolic dim of the user's annotation (`seq+1`), no builtins"
    ),
    ("shapeguard._contract.spec", "eval_symbolic", "eval"): (
        "a symbolic dim of the user's annotation (`seq+1`), only min, max and abs"
    ),
    ("shapeguard._contract.annotations", "resolve_hints", "eval"): (
        "the user's string annotation, in the namespace of the user's function"
    ),
    ("shapeguard._contract.compile", "_make_checker", "exec"): (
        "a body-less function with the user's own signature, for beartype to check the "
        "user's annotations on"
    ),
}
# Generated code that stays: each site names the test that compares it with the plain
# reference function on recorded steps (its docstring gives the measured gain).
GENERATED: dict[tuple[str, str, str], str] = {
    ("shapeguard._trace.replay_match", "_compile_matcher", "exec"): (
        "tests/test_replay_check.py::test_the_matcher_answers_what_the_plain_comparison_answers"
    ),
    ("shapeguard._trace.replay_match", "_compile_matcher", "compile"): (
        "tests/test_replay_check.py::test_the_matcher_answers_what_the_plain_comparison_answers"
    ),
}
# Generated code today with neither (none left).
ALLOWED_GENERATED: set[tuple[str, str, str]] = set()
# A figure with its unit: "2.1x", "35%", "0.8 µs".
MEASURED = re.compile(r"\d[\d.]*\s*(x|×|%|µs|us|ns|ms)(?!\w)")


def _enclosing(tree: ast.AST):
    """(node, qualified name of the function or class around it) for every node."""

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{scope}.{child.name}" if scope else child.name
                yield child, scope
                yield from walk(child, inner)
            else:
                yield child, scope
                yield from walk(child, scope)

    yield from walk(tree, "")


def _source_runs(tree: ast.AST) -> set[tuple[str, str]]:
    """(enclosing function, builtin) of every call of exec, eval or compile by its bare
    name (`re.compile` and `model.eval()` are attributes, not these)."""
    return {
        (scope or "<module>", node.func.id)
        for node, scope in _enclosing(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in RUNS_SOURCE
    }


def source_run_sites() -> set[tuple[str, str, str]]:
    return {(module, *site) for module, tree in TREES.items() for site in _source_runs(tree)}


def _function(module: str, qualname: str) -> ast.AST | None:
    node: ast.AST = TREES[module]
    for part in qualname.split("."):
        node = next(
            (
                n
                for n in getattr(node, "body", [])
                if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
    return node


def _test_exists(spec: str) -> bool:
    path, _, name = spec.partition("::")
    file = ROOT / path
    return file.is_file() and any(
        isinstance(n, ast.FunctionDef) and n.name == name for n in ast.parse(file.read_text()).body
    )


def test_no_generated_code_without_its_reference_test():
    sites = source_run_sites()
    unexplained = sorted(sites - set(USER_CODE) - set(GENERATED) - ALLOWED_GENERATED)
    assert not unexplained, (
        "exec/eval/compile of source: call the plain function instead, or list the site in "
        f"GENERATED with the test that compares it with that function: {unexplained}"
    )
    stale = sorted((set(USER_CODE) | set(GENERATED) | ALLOWED_GENERATED) - sites)
    assert not stale, f"listed but gone (drop them from tests/test_structure.py): {stale}"


def test_kept_generated_code_is_measured_and_checked_against_its_reference():
    for (module, function, builtin), test in GENERATED.items():
        assert _test_exists(test), f"{module}.{function} ({builtin}): no test {test}"
        node = _function(module, function)
        docstring = (ast.get_docstring(node) if node else None) or ""
        assert MEASURED.search(docstring), (
            f"{module}.{function} generates code: its docstring gives the measured gain"
        )


def test_the_source_run_scan_sees_bare_builtins_only():
    tree = ast.parse(
        "import re\n"
        "def f(m):\n    m.eval()\n    re.compile('x')\n    return eval('1')\n"
        "class C:\n    def g(self):\n        exec(compile('x = 1', 'f', 'exec'), {})\n"
    )
    assert _source_runs(tree) == {("f", "eval"), ("C.g", "exec"), ("C.g", "compile")}


# -- (c) no private name of another module ------------------------------------------------
# Private names of other shapeguard modules in use (none left: a name another module needs
# is public in its home module). Entries are (the module using it, "module.name" it uses).
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_uses(module: str, tree: ast.AST) -> set[tuple[str, str]]:
    """("other.module", "_name") for every private name of another shapeguard module that
    `module` imports (`from .x import _y`) or reads off an imported module or an object
    imported from one (`x._y`, `Thing._y`). Submodules are modules, not private names."""
    found = set()
    bound: dict[str, str] = {}  # a local name -> the shapeguard module, or "module:Name"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source not in MODULES:
                continue
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{source}.{alias.name}" in MODULES:
                    bound[local] = f"{source}.{alias.name}"
                elif _private(alias.name) and source != module:
                    found.add((source, alias.name))
                else:
                    bound[local] = f"{source}:{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain = []
        base: ast.AST = node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in bound:
            continue
        owner = bound[base.id]
        for attr in reversed(chain):
            if ":" not in owner and f"{owner}.{attr}" in MODULES:
                owner = f"{owner}.{attr}"
                continue
            if _private(attr) and owner.partition(":")[0] != module:
                found.add((owner.replace(":", "."), attr))
            break
    return found


def private_names_used() -> set[tuple[str, str]]:
    return {
        (module, f"{owner}.{name}")
        for module, tree in TREES.items()
        for owner, name in private_uses(module, tree)
    }


def test_no_module_uses_another_modules_private_names():
    used = private_names_used()
    new = sorted(used - ALLOWED_PRIVATE)
    assert not new, (
        "private names of another module (make the name public in its module, or move the "
        f"code that needs it there): {new}"
    )
    stale = sorted(ALLOWED_PRIVATE - used)
    assert not stale, f"allowed but gone (drop them from ALLOWED_PRIVATE): {stale}"


def test_the_private_name_scan_sees_each_way_of_reaching_in():
    source = (
        "from . import _ops, _names\n"
        "from ._source import _kinds, display\n"
        "from .checks import tp\n"
        "import shapeguard._trace.session as session\n"
        "from ._trace.owed import Owed\n"
        "def f(self, table):\n"
        "    self._mine, table._data\n"  # an instance's: not visible by name
        "    _ops.lookup, _ops._FLOOR, _names.dims._touched, tp.__name__\n"
        "    session._local, Owed._cache, display.__doc__\n"
    )
    uses = private_uses("shapeguard._guard", ast.parse(source))
    assert uses == {
        ("shapeguard._source", "_kinds"),
        ("shapeguard._ops", "_FLOOR"),
        ("shapeguard._names.dims", "_touched"),
        ("shapeguard._trace.session", "_local"),
        ("shapeguard._trace.owed.Owed", "_cache"),
    }


# -- (d) tensor parallelism behind one seam -----------------------------------------------
# The modules of checks/ that may know tensor parallelism: its rules, the view they read
# (`TPView`), and the call view that holds it as its one member `tp`. Other rules ask for a
# TP account of their failures through `checks/_accounts.py`, where tp.py registers it.
TP_MODULES = {"shapeguard.checks.tp", "shapeguard.checks._tp_view", "shapeguard.checks._view"}
TP_RULES = "shapeguard.checks.tp"


def tp_reaches(module: str, tree: ast.AST) -> set[str]:
    """How `module` reaches tensor parallelism: an import of the tp rules (`from . import
    tp`, `from .tp import x`, `import shapeguard.checks.tp`), or a read of the view's `tp`
    member or of a `tp_` member of anything (`call.tp`, `self.call.tp_owner()`)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {f"import {a.name}" for a in node.names if a.name == TP_RULES}
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            if source == TP_RULES or any(f"{source}.{a.name}" == TP_RULES for a in node.names):
                found.add(f"from {source} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute) and (node.attr == "tp" or node.attr.startswith("tp_")):
            found.add(f".{node.attr}")
    return found


def test_only_the_tp_rules_reach_tensor_parallelism():
    reaching = {
        module: sorted(tp_reaches(module, TREES[module]))
        for module in MODULES
        if module.startswith("shapeguard.checks") and module not in TP_MODULES
    }
    reaching = {module: how for module, how in reaching.items() if how}
    assert not reaching, (
        "a rule not about tensor parallelism reaches it: read nothing of `call.tp`, and ask "
        f"for a TP account through checks/_accounts.py instead of importing checks.tp: {reaching}"
    )


def test_the_call_view_holds_tensor_parallelism_in_one_member():
    view = _function("shapeguard.checks._view", "CallView")
    members = {
        n.name
        for n in getattr(view, "body", [])
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    tp_view = _function("shapeguard.checks._tp_view", "TPView")
    tp_members = {n.name for n in getattr(tp_view, "body", []) if isinstance(n, ast.FunctionDef)}
    assert "tp" in members and "tensors" in members and "owner" in tp_members
    reached = sorted(m for m in members if m.startswith("tp_") or m in tp_members)
    assert not reached, (
        "CallView's tensor parallelism is its one member `tp` (a checks._tp_view.TPView): "
        f"move these onto TPView: {reached}"
    )


def test_the_tp_scan_sees_each_way_of_reaching_in():
    source = (
        "from . import tp\n"
        "from .tp import view_violation\n"
        "import shapeguard.checks.tp\n"
        "from . import _accounts, tiling\n"
        "def f(call, self, split):\n"
        "    call.tp, self.call.tp_owner(), call.tensors(), split.tiles\n"
    )
    assert tp_reaches("shapeguard.checks.heads_view", ast.parse(source)) == {
        "from shapeguard.checks import tp",
        "from shapeguard.checks.tp import view_violation",
        "import shapeguard.checks.tp",
        ".tp",
        ".tp_owner",
    }
