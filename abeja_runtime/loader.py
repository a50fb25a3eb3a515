"""Finding and importing the user's handler (contract A4 / Part B 4).

``prepare_workdir`` runs once in the supervisor: it settles the working directory (the
``ABEJA_USER_MODEL_ROOT`` and ``.abeja`` rules) and exports ``ABEJA_TRAINING_RESULT_DIR`` as an
absolute path, which worker processes inherit. ``load_handler`` runs in each worker, on the thread
that will call the handler. Every failure is a :class:`HandlerLoadError` whose message keeps the
anchor's wording (typos fixed) and adds what to do.
"""

from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from abeja_runtime.errors import HandlerLoadError

__all__ = [
    "LoadedHandler",
    "install_dependencies",
    "load_handler",
    "prepare_workdir",
    "resolve_training_result_dir",
]

_MARKER: Final = ".abeja"
#: The anchor finds a ``.abeja`` directory whose parent is at most this deep below the start.
_MARKER_MAX_DEPTH: Final = 3
_DEFAULT_TRAINING_RESULT_DIR: Final = "abejainc_training_result"


@dataclass(frozen=True)
class LoadedHandler:
    """The handler, and whether it must be awaited (decided once, at load time)."""

    func: Any
    is_async: bool
    name: str


def prepare_workdir(user_model_root: str, training_result_dir: str) -> Path:
    """Change into the user's code directory and export the absolute training-result dir."""
    root = Path(user_model_root or ".").expanduser()
    workdir = _find_marker_parent(root.resolve())
    os.chdir(workdir)
    os.environ["ABEJA_TRAINING_RESULT_DIR"] = str(
        resolve_training_result_dir(workdir, training_result_dir)
    )
    return workdir


def resolve_training_result_dir(workdir: Path, value: str) -> Path:
    """Absolute as given; relative to the working dir; empty → ``abejainc_training_result``."""
    return workdir / (value or _DEFAULT_TRAINING_RESULT_DIR)


def _find_marker_parent(start: Path) -> Path:
    """Breadth-first search for a ``.abeja`` directory; its parent becomes the working dir.

    Unlike the anchor, the order is sorted (stable across filesystems) and unreadable
    directories are skipped instead of crashing the start-up.
    """
    pending: deque[tuple[Path, int]] = deque([(start, 0)])
    while pending:
        directory, depth = pending.popleft()
        if (directory / _MARKER).is_dir():
            return directory
        if depth >= _MARKER_MAX_DEPTH:
            continue
        try:
            children = sorted(entry for entry in directory.iterdir() if _is_plain_dir(entry))
        except OSError:
            continue
        pending.extend((child, depth + 1) for child in children)
    return start


def _is_plain_dir(entry: Path) -> bool:
    try:
        return entry.is_dir() and not entry.is_symlink() and entry.name != _MARKER
    except OSError:
        return False


def install_dependencies(workdir: Path) -> None:
    """Install ``Pipfile`` or ``requirements.txt`` as the anchor does at every start (opt-in)."""
    if (workdir / "Pipfile").exists():
        command = [sys.executable, "-m", "pipenv", "install", "--system"]
        if not (workdir / "Pipfile.lock").exists():
            command.append("--skip-lock")
    elif (workdir / "requirements.txt").exists():
        command = [sys.executable, "-m", "pip", "install", "-r", "requirements.txt"]
    else:
        return
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise HandlerLoadError(
            f"error while installing dependencies with {' '.join(command[2:4])} "
            f"(exit {result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
        )


def load_handler(spec: str, workdir: Path) -> LoadedHandler:
    """Import ``module:function`` from the working directory."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or ":" in func_name or not module_name or not func_name:
        raise HandlerLoadError(
            f"Possibly, your HANDLER[{spec}] parameter is wrong. handler needs one ':' separator. "
            "The format is <module>:<function>, e.g. main:handler."
        )
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    module = _import(module_name, spec)
    try:
        func = getattr(module, func_name)
    except AttributeError:
        defined = sorted(
            name
            for name, value in vars(module).items()
            if callable(value)
            and not name.startswith("_")
            and not inspect.isclass(value)
            and getattr(value, "__module__", None) == module.__name__
        )
        raise HandlerLoadError(
            f"Couldn't import a function named [{func_name}] specified in HANDLER[{spec}]. "
            f"Possibly, your HANDLER parameter is wrong. Module {module_name} defines: "
            f"{', '.join(defined) or 'no functions'}."
        ) from None
    if not callable(func):
        raise HandlerLoadError(
            f"HANDLER[{spec}] names {func_name}, which is a {type(func).__name__}, "
            "not a function; point HANDLER at def handler(request, context)."
        )
    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )
    return LoadedHandler(func=func, is_async=is_async, name=spec)


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise HandlerLoadError(
                f"Couldn't import a module named [{module_name}] specified in HANDLER[{spec}]. "
                "Possibly, your HANDLER parameter or packaging (zip/tar) file structure is wrong. "
                f"{exc} (working directory: {os.getcwd()})"
            ) from exc
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] failed: {exc}. "
            "Add the missing package to requirements.txt."
        ) from exc
    except Exception as exc:
        raise HandlerLoadError(
            f"Importing the module [{module_name}] specified in HANDLER[{spec}] raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
