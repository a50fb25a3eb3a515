"""``--reload``: notice when a project's ``.py`` files change, by polling their mtimes.

Polling needs no extra dependency, works the same on bind mounts and network drives, and a
project holds few Python files; twice a second is quick enough for an edit-and-retry loop.
"""

from __future__ import annotations

import os
from pathlib import Path

from abeja_cli.images import EXCLUDED_DIRS

__all__ = ["ChangeWatcher"]


_Snapshot = dict[Path, tuple[int, int]]


class ChangeWatcher:
    """Reports the files (matching ``suffixes``) added, removed or modified since last asked."""

    def __init__(self, root: Path, suffixes: tuple[str, ...] = (".py",)) -> None:
        self.root = root
        self.suffixes = suffixes
        self._snapshot = self._scan()

    def _scan(self) -> _Snapshot:
        snapshot: _Snapshot = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith(".")]
            for name in filenames:
                if name.endswith(self.suffixes):
                    path = Path(dirpath, name)
                    try:
                        stat = path.stat()
                    except OSError:
                        continue  # removed between listing and stat: seen as removed
                    snapshot[path] = (stat.st_mtime_ns, stat.st_size)
        return snapshot

    def changes(self) -> list[Path]:
        """Paths changed since the previous call (or since creation), sorted."""
        current = self._scan()
        previous, self._snapshot = self._snapshot, current
        changed = {p for p in current.keys() | previous.keys() if current.get(p) != previous.get(p)}
        return sorted(changed)
