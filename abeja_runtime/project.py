"""The handler's project folder, settled once at start-up (contract A4 / Part B 4).

``prepare_workdir`` runs in the front before any handler process starts: it changes into the
code directory (the ``ABEJA_USER_MODEL_ROOT`` and ``.abeja`` rules) and exports the variables
ABEJA's handler page lists for handlers to read, which handler processes inherit:
``ABEJA_TRAINING_RESULT_DIR`` as an absolute path, and ``HANDLER`` (also when it was given as
``--handler``, not in the environment).
``install_dependencies`` installs what the project asks for, when asked to
(``--install-requirements``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Final

from abeja_runtime.config import resolve_training_result_dir
from abeja_runtime.errors import HandlerLoadError

__all__ = ["install_dependencies", "prepare_workdir"]

_MARKER: Final = ".abeja"
#: ABEJA Platform finds a ``.abeja`` directory whose parent is at most this deep below the start.
_MARKER_MAX_DEPTH: Final = 3


def prepare_workdir(user_model_root: str, training_result_dir: str, handler: str) -> Path:
    """Change into the user's code directory and export the handler's variables."""
    root = Path(user_model_root or ".").expanduser()
    workdir = _find_marker_parent(root.resolve())
    os.chdir(workdir)
    os.environ["ABEJA_TRAINING_RESULT_DIR"] = str(
        resolve_training_result_dir(workdir, training_result_dir)
    )
    os.environ["HANDLER"] = handler
    return workdir


def _find_marker_parent(start: Path) -> Path:
    """Breadth-first search for a ``.abeja`` directory; its parent becomes the working dir.

    Unlike ABEJA Platform, the order is sorted (stable across filesystems) and unreadable
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
    """Install ``Pipfile`` or ``requirements.txt`` as ABEJA Platform does at every start
    (opt-in)."""
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
