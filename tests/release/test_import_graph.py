"""No import circles between the course's modules (issue 34).

A circle (``a`` imports ``b``, which imports ``a``, at the top of a module or inside a function) means
neither module can be read, tested or cut down without the other. The graph is read from the source
with :mod:`ast`; nothing is imported. A package's ``__init__`` that re-exports its submodules is not a
circle by itself: only what a module names is an edge (``from pkg import sub`` is an edge to ``pkg.sub``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("course_utils", "grader")

#: Circles still to cut: none since issue 34 (never add one).
KNOWN: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        parts = module.split(".")[: None if is_package else -1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Each course module -> the course modules it imports anywhere in its source."""
    known = _modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported(node, name, path.name == "__init__.py", known):
                while target and target not in known:  # `import a.b.c` where c is a name, not a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def test_the_finder_sees_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == {frozenset("abc")}


def test_no_new_import_circle():
    found = circles(import_graph())
    new = found - KNOWN
    assert not new, "new import circles: " + "; ".join(" <-> ".join(sorted(c)) for c in new)
    gone = KNOWN - found
    assert not gone, "these circles are gone: remove them from KNOWN: " + "; ".join(
        " <-> ".join(sorted(c)) for c in gone)
