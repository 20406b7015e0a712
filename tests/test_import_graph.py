"""No circle of imports in the package.

A circle of imports means two modules that cannot be understood, tested or moved one
without the other, and it is usually hidden: an import inside a function (to dodge the
circle at load time) or under ``TYPE_CHECKING`` (to name the other's type).  So this test
reads every module's imports with :mod:`ast`, wherever they stand in the file, builds the
package's import graph over api/, daemon/, stages/ and supervision/, and fails on any
strongly connected set of modules, naming one circle in it.  Imports of a package's
``__init__`` that Python performs implicitly (importing ``a.b`` runs ``a``) are not edges:
only what a module names.

To look at the graph by hand: ``python tests/test_import_graph.py`` prints every edge.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: folder -> the package it installs as (setup.cfg's package_dir)
FOLDERS = {"api": "offbroadway", "daemon": "offbroadway.daemon",
           "stages": "offbroadway.stages", "supervision": "offbroadway.supervision"}


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (packages by their own name)."""
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if name == "offbroadway" and folder != "api":
                continue
            out.setdefault(name, path)
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, at any depth of its file."""
    tree = ast.parse(path.read_text(), str(path))
    here = name if _is_package(path) else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in known:
                    out.add(sub)       # `from . import reactions`: the submodule
                elif source in known:
                    out.add(source)    # a name defined in ``source``
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected set of two or more modules (Tarjan's), each as a
    path that starts and ends at the same module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[set[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_circle(edges, group) for group in groups]


def _circle(edges: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges[v] & group):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError("a strongly connected group has a circle")


def test_the_graph_sees_the_package() -> None:
    edges = graph()
    assert "offbroadway.daemon.shell.app" in edges and "offbroadway.supervision.supervisor" in edges
    assert "offbroadway.daemon.core.reactions" in edges["offbroadway.daemon.shell.app"]


def test_the_cycle_finder_finds_a_hidden_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_imports_itself_back() -> None:
    found = cycles(graph())
    assert not found, "import circles (each module imports the next, at any depth of its " \
        "file, TYPE_CHECKING included):\n" + "\n".join(" -> ".join(c) for c in found)


if __name__ == "__main__":
    for module, targets in sorted(graph().items()):
        for target in sorted(targets):
            print(f"{module} -> {target}")
