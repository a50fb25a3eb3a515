"""The one temporary folder of a running front, and the sweep of those a killed front left.

A front keeps everything it writes to disk in one folder under ``TMPDIR``: its handler
processes' metrics files (``metrics/``) and the scratch folders of spooled request bodies. A
front that stops removes it; one that is killed (``kill -9``, the OOM killer) cannot, so a
starting front removes every folder whose ``lock`` file it can lock: a running front holds an
exclusive ``flock`` on its own, which the kernel lets go of however it dies (a pid could be
reused, or be another container's on a shared ``TMPDIR``). The folder is locked under a name the
sweep does not look at, then renamed, so that no sweep sees it unlocked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from abeja_runtime.spool import SCRATCH_VARIABLE

__all__ = ["run_folder"]

_log = logging.getLogger("abeja_runtime")

_PREFIX: Final = "abeja-runtime-"
_LOCK: Final = "lock"


@contextlib.contextmanager
def run_folder() -> Iterator[Path]:
    """This front's folder while it runs, stale ones swept first; request bodies are spooled in
    it (:data:`~abeja_runtime.spool.SCRATCH_VARIABLE`, which handler processes inherit)."""
    root = Path(tempfile.gettempdir())
    _sweep(root)
    starting = Path(tempfile.mkdtemp(prefix=f".{_PREFIX}starting-", dir=root))
    lock = os.open(starting / _LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        folder = root / (_PREFIX + starting.name.rsplit("-", 1)[1])
        starting.rename(folder)
        (folder / "metrics").mkdir()
        os.environ[SCRATCH_VARIABLE] = str(folder)
        try:
            yield folder
        finally:
            os.environ.pop(SCRATCH_VARIABLE, None)
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        os.close(lock)
        shutil.rmtree(starting, ignore_errors=True)  # if the rename never came


def _sweep(root: Path) -> None:
    """Remove the folders of fronts that no longer run (their lock is free)."""
    try:
        candidates = [entry for entry in root.iterdir() if entry.name.startswith(_PREFIX)]
    except OSError:
        return
    for folder in candidates:
        try:
            lock = os.open(folder / _LOCK, os.O_RDWR | os.O_CLOEXEC)
        except OSError:  # not a front's folder, or not ours to open
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held: its front runs
            continue
        finally:
            os.close(lock)
        _log.info("removed %s, left by an abeja-runtime that was killed", folder)
