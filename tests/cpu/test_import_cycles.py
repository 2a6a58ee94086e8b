"""flashkit's modules import each other without a circle (package __init__ files, which re-export, excluded)."""

from __future__ import annotations

import ast
from pathlib import Path

import flashkit

ROOT = Path(flashkit.__file__).resolve().parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the package (__init__ files as the package's name)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported(name: str, path: Path, node: ast.AST) -> list[str]:
    """The modules an import statement names: the module itself and each `from m import x` as m.x."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{a.name}" for a in node.names]


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Edges between the package's plain modules, from every import anywhere in each file (lazy ones too)."""
    files = module_files(root)
    plain = {n for n, p in files.items() if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {n: set() for n in plain}
    for name in plain:
        for node in ast.walk(ast.parse(files[name].read_text(encoding="utf-8"))):
            graph[name] |= {t for t in imported(name, files[name], node) if t in plain and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path that returns to its start, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_walk_sees_the_package():
    graph = import_graph()
    assert "flashkit.api" in graph and "flashkit.verify.harness" in graph
    assert "flashkit.runtime.device" in graph["flashkit.api"]
    assert "flashkit.verify.harness" in graph["flashkit.verify.dense"]


def test_the_check_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
