"""The package's shape: one-way imports between its wings, no import circles, short functions.

The graph is read from the source with :mod:`ast`: every ``import`` of a ``zarr_skip`` module,
at module level or inside a function, except those under ``if TYPE_CHECKING:`` (type-only).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import zarr_skip

PKG_DIR = Path(zarr_skip.__file__).parent

#: each wing may import its own modules and those of lower rank (docs: README "Layout of the code")
RANKS: dict[str, int] = {
    "errors": 0,
    "_deprecation": 0,
    "_humanize": 0,
    "format": 1,
    "store": 2,
    "views": 3,
    "lazy": 4,
    "tables": 4,
    "maintenance": 4,
    "cache": 5,
    "synthetic": 6,
    "trainer": 6,
    "legacy": 7,
    "notebook": 7,
    "plots": 8,
    "cli": 8,
    "__main__": 9,  # python -m zarr_skip: the CLI
    "integrations": 8,
    "data": 8,
    "demo": 9,
}
#: imports that go up on purpose, lazily inside a function
UPWARD_ALLOWED = {
    ("zarr_skip", "trainer"),  # the package's lazy ``SkipManager`` attribute
}
#: the public handle: it imports its views (and the rest below it) at module top
HANDLE = ("zarr_skip.cache", "zarr_skip.lazy", "zarr_skip.tables", "zarr_skip.maintenance")
#: the longest a function may be (its lines, decorators and docstring included)
MAX_FUNCTION_LINES = 80
#: functions allowed to be longer (none)
LONG_FUNCTIONS_KNOWN: set[str] = set()


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def target(mod: str) -> str | None:
        while mod and mod not in modules:
            mod = mod.rpartition(".")[0]
        return mod or None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("zarr_skip") and (t := target(alias.name)):
                    found.add(t)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_pkg else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            if mod.startswith("zarr_skip"):
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    t = sub if sub in modules else target(mod)
                    if t:
                        found.add(t)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    names = set(mods)
    return {n: _imports(p, n, names) for n, p in mods.items()}


def _wing(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "zarr_skip"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_circles() -> None:
    graph = _graph()
    # package __init__ modules re-export their children; an edge child -> own package is a circle
    # only in name, since Python runs the child first
    for mod, deps in graph.items():
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    assert _cycles(graph) == []


def test_the_circle_finder_finds_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_wing_has_a_rank() -> None:
    wings = {_wing(m) for m in _modules()} - {"zarr_skip"}
    assert wings <= set(RANKS), f"wings without a rank in RANKS: {sorted(wings - set(RANKS))}"


def test_imports_point_down_the_wings() -> None:
    # the package's own __init__ is the public door: it sits just above the public handle
    rank = {**RANKS, "zarr_skip": RANKS["cache"]}
    wrong = []
    for mod, deps in _graph().items():
        src = _wing(mod)
        for dep in deps:
            dst = _wing(dep)
            if src == dst or dst == "zarr_skip" and src != "zarr_skip":
                continue
            if rank[dst] > rank[src] and (src, dst) not in UPWARD_ALLOWED:
                wrong.append(f"{mod} -> {dep}")
    assert wrong == []


def test_the_format_wing_does_no_io() -> None:
    banned = {"zarr", "pathlib", "shutil", "obstore", "s3fs", "fsspec"}  # storage stays in store/
    bad = []
    for mod, path in _modules().items():
        if _wing(mod) != "format":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            bad += [f"{mod}: {n}" for n in names if n.split(".")[0] in banned]
    assert bad == []


def _function_lengths(source: str, module: str) -> dict[str, int]:
    """``module.[Class.]function`` -> its lines, for every function of a module (nested ones too)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out[f"{prefix}.{child.name}"] = (child.end_lineno or child.lineno) - first + 1
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(ast.parse(source), module)
    return out


def _tree_modules() -> dict[str, Path]:
    """The package's modules, and the benchmarks' and the tests' own: the tree's code."""
    root = PKG_DIR.parent
    others = sorted([*(root / "benchmarks").rglob("*.py"), *(root / "tests").rglob("*.py")])
    return {**_modules(), **{".".join(p.relative_to(root).with_suffix("").parts): p for p in others}}


def test_functions_stay_short() -> None:
    lengths = {f: n for m, p in _tree_modules().items() for f, n in _function_lengths(p.read_text(), m).items()}
    long = {f: n for f, n in lengths.items() if n > MAX_FUNCTION_LINES and f not in LONG_FUNCTIONS_KNOWN}
    assert long == {}, f"split these functions (at most {MAX_FUNCTION_LINES} lines): {long}"


def test_the_function_length_check_measures_functions() -> None:
    source = textwrap.dedent("""
        @decorated
        def outer():
            def inner():
                return 1

            return inner


        class C:
            async def method(self):
                pass
        """)
    assert _function_lengths(source, "m") == {"m.outer": 6, "m.outer.inner": 2, "m.C.method": 2}


def test_the_handle_imports_its_wings_at_module_top() -> None:
    late = []
    for mod in HANDLE:
        tree = ast.parse(_modules()[mod].read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.level or (inner.module or "").startswith("zarr_skip")):
                    late.append(f"{mod}.{node.name}: from {inner.module} import ...")
                elif isinstance(inner, ast.Import) and any(a.name.startswith("zarr_skip") for a in inner.names):
                    late.append(f"{mod}.{node.name}: import ...")
    assert late == []


def test_few_modules_sit_directly_in_the_package() -> None:
    top = sorted(p.name for p in PKG_DIR.glob("*.py"))
    assert len(top) <= 10, top
