"""No circle of imports in the package.

A circle of imports means two modules that cannot be understood, tested or moved one
without the other, and it is usually hidden: an import inside a function (to dodge the
circle at load time) or under ``TYPE_CHECKING`` (to name the other's type).  So this test
reads every module's imports with :mod:`ast`, wherever they stand in the file, builds the
package's import graph over api/, daemon/, stages/ and supervision/, and fails on any
strongly connected set of modules, naming one circle in it.  Imports of a package's
``__init__`` that Python performs implicitly (importing ``a.b`` runs ``a``) are not edges:
only what a module names.

The same graph, read folder by folder, holds the layout's other facts:

* no circle between the folders of daemon/ and supervision/ either: a folder (a room) is
  read, tested and moved as a whole only if it does not need one that needs it.  (The
  folders of stages/ still import each other, runtime/worker.py the roles and the roles
  the runtime: they join this check once they no longer do.)
* daemon/'s rooms import one way, in :data:`ROOMS` order: the config knows nothing of the
  rest, the core only the config, and the CLI is imported by nothing but the entry
  points (``python -m offbroadway``).
* the daemon's core does no I/O: none of its modules imports a module that reaches the
  world (:data:`IO_MODULES`: sockets, processes, signals, threads, files through ``os``);
  the shell acts on what it decides.
* no folder holds more than 12 modules and no module is over 600 lines: past that, a
  folder no longer shows what is in it, and a module does more than one job.

To look at the graph by hand: ``python tests/test_import_graph.py`` prints every edge,
``--folders`` the edges between folders.
"""

from __future__ import annotations

import ast
import sys
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: folder -> the package it installs as (setup.cfg's package_dir)
FOLDERS = {"api": "offbroadway", "daemon": "offbroadway.daemon",
           "stages": "offbroadway.stages", "supervision": "offbroadway.supervision"}
#: the folders checked for circles between folders (see the module's docstring)
ROOMED = ("daemon", "stages", "supervision")
#: daemon/'s rooms, each importing only those before it
ROOMS = ("config", "core", "spark", "observe", "shell", "cli")
#: where the command line starts: the only modules outside daemon/cli/ that import it
ENTRY_POINTS = {"offbroadway.__main__"}
#: what the daemon's core must not import: the ways to reach the world
IO_MODULES = {"os", "socket", "subprocess", "asyncio", "selectors", "signal", "fcntl",
              "threading", "multiprocessing", "shutil", "tomllib", "curses", "http",
              "urllib", "wsgiref", "zmq", "psutil", "pika", "redis", "nats", "pyspark"}
MAX_MODULES = 12
MAX_LINES = 600

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


def folder_of(path: Path) -> str:
    """A module's folder, as the repository names it (``daemon/core``)."""
    return str(path.parent.relative_to(ROOT))


def folder_graph(edges: dict[str, set[str]], known: dict[str, Path]
                 ) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """Folder -> the folders its modules import, and for each such edge the module edges
    behind it; what the entry points import is left out (they start everything)."""
    out: dict[str, set[str]] = {}
    why: dict[tuple[str, str], list[str]] = {}
    for module, targets in edges.items():
        if module in ENTRY_POINTS:
            continue
        a = folder_of(known[module])
        for target in targets:
            b = folder_of(known[target])
            if a != b:
                out.setdefault(a, set()).add(b)
                why.setdefault((a, b), []).append(f"{module} -> {target}")
    return out, why


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["offbroadway", "daemon"] and len(parts) > 2 else None


def test_the_folder_graph_sees_the_rooms() -> None:
    known = modules()
    folders, _ = folder_graph(graph(), known)
    assert "daemon/config" in folders["daemon/core"] and "daemon/core" in folders["daemon/shell"]
    assert {room_of(m) for m in known} >= set(ROOMS)
    assert set(ROOMS) == {p.name for p in (ROOT / "daemon").iterdir()
                          if (p / "__init__.py").exists()}, "a room of daemon/ is not in ROOMS"


def test_no_folder_imports_itself_back() -> None:
    known = modules()
    folders, why = folder_graph(graph(), known)
    inside = {a: {b for b in bs if b.split("/")[0] in ROOMED}
              for a, bs in folders.items() if a.split("/")[0] in ROOMED}
    found = cycles(inside)
    assert not found, "folders that import each other:\n" + "\n".join(
        " -> ".join(c) + "\n    " + "\n    ".join(why[(a, b)][0] for a, b in pairwise(c))
        for c in found)


def test_the_daemon_rooms_import_one_way_and_nothing_imports_the_cli() -> None:
    back = []
    for module, targets in graph().items():
        mine = room_of(module)
        for target in targets:
            theirs = room_of(target)
            if theirs is None or theirs == mine:
                continue
            if theirs == "cli" and module not in ENTRY_POINTS:
                back.append(f"{module} -> {target} (only the entry points import the CLI)")
            elif mine in ROOMS and ROOMS.index(theirs) > ROOMS.index(mine):
                back.append(f"{module} -> {target} ({mine} comes before {theirs})")
    assert not back, "imports against the rooms' order " + " <- ".join(ROOMS) + ":\n" + \
        "\n".join(sorted(back))


def test_the_daemon_core_does_no_io() -> None:
    found = []
    for module, path in modules().items():
        if room_of(module) != "core":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            found += [f"{module}: import {n}" for n in names if n.split(".")[0] in IO_MODULES]
    assert not found, "the core imports I/O (the shell's job):\n" + "\n".join(found)


def _python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_no_folder_holds_more_than_twelve_modules() -> None:
    per_folder: dict[str, list[str]] = {}
    for path in _python_files():
        if path.name != "__init__.py":
            per_folder.setdefault(folder_of(path), []).append(path.name)
    crowded = {f: len(m) for f, m in per_folder.items() if len(m) > MAX_MODULES}
    assert not crowded, f"folders over {MAX_MODULES} modules (__init__.py not counted): " \
        f"{crowded}; move a group of them into a sub-folder"


def test_no_module_is_over_six_hundred_lines() -> None:
    lines = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _python_files()}
    long = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split them by job"


if __name__ == "__main__":
    if sys.argv[1:] == ["--folders"]:
        folders, why = folder_graph(graph(), modules())
        for a, bs in sorted(folders.items()):
            for b in sorted(bs):
                print(f"{a} -> {b}  ({len(why[(a, b)])}: {why[(a, b)][0]}, ...)")
    else:
        for module, targets in sorted(graph().items()):
            for target in sorted(targets):
                print(f"{module} -> {target}")
