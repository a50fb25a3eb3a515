"""The names the code's docstrings and comments cite exist: a module, class or function named as
``abeja_runtime.<...>`` (a Sphinx role's target or plain text), and a source file named as
``<name>.py``. Five of twenty sampled docstrings had gone stale when files moved (a
``worker.py`` that had become ``worker/process.py``): this keeps them true when code moves."""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("abeja_runtime", "abeja_cli")
#: Where a file named in a docstring may live.
SOURCE_FOLDERS = ("abeja_runtime", "abeja_cli", "scripts", "benchmarks", "tests", "images")

_DOTTED = re.compile(r"\b(abeja_(?:runtime|cli)(?:\.\w+)+)")
_FILE = re.compile(r"(?<![\w/.\\-])((?:\w+/)*\w+\.py)\b")


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


@cache
def _file_names() -> frozenset[str]:
    """Every source file's path relative to each folder above it (``calls.py``,
    ``front/calls.py``, ``abeja_runtime/front/calls.py``)."""
    names: set[str] = set()
    for folder in SOURCE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            names.update("/".join(parts[index:]) for index in range(len(parts)))
    return frozenset(names)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _defined(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body binds (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, fallbacks
            names.update(_defined(node.body))
            for handler in getattr(node, "handlers", []):
                names.update(_defined(handler.body))
            names.update(_defined(node.orelse))
    return names


def _class_body(body: list[ast.stmt], name: str) -> list[ast.stmt] | None:
    for node in body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node.body
    return None


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    path = ROOT
    index = 0
    while index < len(parts):
        package = path / parts[index]
        module = path / f"{parts[index]}.py"
        if package.is_dir():
            path = package
        elif module.is_file():
            path = module
            index += 1
            break
        else:
            break
        index += 1
    source = path / "__init__.py" if path.is_dir() else path
    if not source.is_file():
        return False
    body: list[ast.stmt] | None = _tree(source).body
    for name in parts[index:]:
        if body is None:
            return True  # an attribute of a function or an instance: not checked further
        if name not in _defined(body) and not (path.is_dir() and (path / name).exists()):
            return False
        body = _class_body(body, name)
    return True


def _texts(path: Path) -> list[tuple[int, str]]:
    """The docstrings and comments of a source file, with their first line."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (number, line.split("#", 1)[1])
        for number, line in enumerate(source.splitlines(), 1)
        if "#" in line
    ]
    for node in ast.walk(_tree(path)):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ) and (docstring := ast.get_docstring(node, clean=False)):
            texts.append((getattr(node, "lineno", 1), docstring))
    return texts


def test_the_modules_classes_and_functions_docstrings_cite_exist() -> None:
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {dotted}"
        for path in _sources()
        for line, text in _texts(path)
        for dotted in _DOTTED.findall(text)
        if not _resolves(dotted.rstrip("."))
    ]
    assert not missing, "docstrings cite names that do not exist:\n" + "\n".join(missing)


def _elsewhere(name: str) -> bool:
    """A file of another installed package (``aiohttp/__init__.py``)."""
    first = name.split("/", 1)[0]
    return "/" in name and importlib.util.find_spec(first) is not None


def test_the_source_files_docstrings_cite_exist() -> None:
    names = _file_names()
    missing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _sources()
        for line, text in _texts(path)
        for name in _FILE.findall(text)
        if name not in names and not _elsewhere(name)
    ]
    assert not missing, "docstrings cite files that do not exist:\n" + "\n".join(missing)
