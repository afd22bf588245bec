"""No import cycle among the modules of `distill`, imports inside functions included.

A cycle hidden in a function-level import still ties two modules into one concept with two homes, and it breaks
as soon as someone moves the import to the top. The graph is read from the source with `ast`, so nothing is
imported: every `import` and `from ... import` anywhere in a module (a function body, a class, a try block)
counts, relative imports are resolved, and `from distill.x import name` is an edge to `distill.x.name` when that
is a module. Left out, because they do not tie modules together at import time: imports under
`if TYPE_CHECKING:`, names given to importlib or pkgutil as strings, and the implicit import of a module's
parent packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_names(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `package_dir` (a package is its __init__.py)."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _main_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _imports(tree: ast.AST):
    """Every Import and ImportFrom node, at any depth, except those under `if TYPE_CHECKING:` and
    `if __name__ == "__main__":` (run as a script only, never on import: `python -m distill.X` runs its command
    through distill.cli, which imports the module afresh)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and (_type_checking(node) or _main_guard(node)):
            children = node.orelse
        stack.extend(children)


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """`name` or its longest prefix that is one of the package's modules (`import distill.a.b` runs distill.a.b)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if (prefix := ".".join(parts[:end])) in modules:
            return prefix
    return None


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]  # what a relative import is relative to
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [_known(alias.name, modules) for alias in node.names]
            else:
                if node.level:
                    base = ".".join(here.split(".")[: len(here.split(".")) - node.level + 1])
                    base = ".".join(p for p in (base, node.module) if p)
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else _known(base, modules)
                           for alias in node.names]
            graph[name].update(t for t in targets if t is not None and t != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle as the path round it (`[a, b, a]`), or None; nodes and edges visited in sorted order, so the
    cycle named is always the same one."""
    done: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(node: str) -> list[str] | None:
        on_path[node] = len(path)
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return path[on_path[nxt]:] + [nxt]
            if nxt not in done and (cycle := visit(nxt)):
                return cycle
        path.pop()
        del on_path[node]
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done and (cycle := visit(start)):
            return cycle
    return None


def imports_into(graph: dict[str, set[str]], package: str, banned: tuple[str, ...]) -> list[tuple[str, str]]:
    """(module, import) for each module of `package` (itself or under it) that imports one of `banned` (a module,
    or anything under it), sorted."""
    def within(name: str, roots) -> bool:
        return any(name == r or name.startswith(r + ".") for r in roots)

    return sorted((m, t) for m, targets in graph.items() if within(m, [package]) for t in targets if within(t, banned))


# --------------------------------------------------------------------------------- the checker itself


def test_find_cycle_names_the_cycle_and_passes_an_acyclic_graph():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"d": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) is None  # a diamond is no cycle
    assert find_cycle({}) is None


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_import_graph_sees_function_level_relative_and_submodule_imports(tmp_path):
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import os\nfrom pkg.sub import b\n",  # a submodule named in `from ... import`
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import thing\n",  # relative, and inside a function
        "pkg/c.py": "import pkg.sub.b as b\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "pkg/d.py": "from . import a\nfrom pkg import c, VERSION\n",
    })
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.c"},
                     "pkg.c": {"pkg.sub.b"}, "pkg.d": {"pkg.a", "pkg.c", "pkg"}}
    assert find_cycle(graph) == ["pkg.sub.b", "pkg.c", "pkg.sub.b"]  # b's import inside a function still counts


def test_imports_into_names_a_core_module_that_imports_upward():
    graph = {"pkg.core": {"pkg.low"}, "pkg.core.a": {"pkg.core", "pkg.high.b"}, "pkg.coreish": {"pkg.high"},
             "pkg.high": {"pkg.core"}, "pkg.high.b": set(), "pkg.low": set()}
    assert imports_into(graph, "pkg.core", ("pkg.high",)) == [("pkg.core.a", "pkg.high.b")]  # not pkg.coreish
    assert imports_into(graph, "pkg.core", ("pkg.low",)) == [("pkg.core", "pkg.low")]
    assert imports_into(graph, "pkg.high", ("pkg.low",)) == []


# ------------------------------------------------------------------------------------------ the package


def test_distill_has_no_import_cycle():
    graph = import_graph(ROOT / "distill")
    # the reader sees the package's real edges (an empty graph would pass for the wrong reason)
    assert {"distill.evaluate"} <= graph["distill.report"]
    assert {"distill.agent.baselines", "distill.rewoo.agent"} <= graph["distill.agent.factory"]
    assert "distill.rewoo.record" in graph["distill.rewoo.agent"]
    assert {"distill.tools.calculator", "distill.tools.wikipedia"} <= graph["distill.tools.registry"]
    assert "distill.agent.factory" in graph["distill.evaluate"]  # imported inside build_method
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_rewoo_core_imports_nothing_above_it():
    """`distill.rewoo` is the ReWOO core (plans, the Worker, prompts, the record, `ReWOOAgent`): the baselines
    import it, and the factory from a config to an agent (`distill.agent.factory`) imports both, never the reverse."""
    graph = import_graph(ROOT / "distill")
    assert {"distill.rewoo.agent", "distill.rewoo.plan", "distill.rewoo.worker"} <= set(graph)  # the core is read
    assert "distill.rewoo.record" in graph["distill.agent.baselines"]  # the baselines stand on the core
    upward = imports_into(graph, "distill.rewoo", ("distill.agent.factory", "distill.agent.baselines", "distill.core.config"))
    assert upward == [], "the ReWOO core imports above it: " + ", ".join(f"{m} -> {t}" for m, t in upward)
