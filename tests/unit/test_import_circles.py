"""No module of the runtime or the CLI imports, at its top, one that imports it back, however
long the way round, typing-only imports (under ``if TYPE_CHECKING:``) included (issue 38 point
4): a circle means two modules that cannot be read, tested or changed apart. Imports inside a
function are left out: they run when called, after both modules are whole.

The walk reads the source (``ast``), so it sees the typing-only imports that running the code
never makes."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("abeja_runtime", "abeja_cli")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements a module runs as it is imported, into ``if`` and ``try`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            yield from top_level(node.body)
            yield from top_level(node.orelse)
            for handler in getattr(node, "handlers", []):
                yield from top_level(handler.body)


def imported_by(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in top_level(ast.parse(path.read_text()).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join([*base, node.module] if node.module else base)
            module = module if node.level else (node.module or "")
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # submodules
    return {module for module in found if module in known and module != name}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return seen


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The groups of modules that reach each other through their imports."""
    reach = {node: reachable(graph, node) for node in graph}
    return {
        tuple(sorted(other for other in reach[node] if node in reach[other]))
        for node in graph
        if node in reach[node]
    }


def test_no_module_imports_itself_back_round_a_circle() -> None:
    known = modules()
    graph = {name: imported_by(name, path, known) for name, path in known.items()}
    assert circles(graph) == set()


def test_the_walk_finds_a_typing_only_circle() -> None:
    """The check itself: two modules that import each other, one only for typing."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert circles(graph) == {("a", "b")}
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from abeja_cli import x\n"
    tree = ast.parse(source)
    assert any(isinstance(node, ast.ImportFrom) for node in top_level(tree.body))
