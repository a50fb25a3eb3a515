"""Request bodies held in memory up to a threshold and spooled to disk above it (contract A1).

Each request gets at most one scratch directory, made only when a body first outgrows the
threshold, and removed whole when the request ends, whatever path it ends on. Spooled files keep
a real ``name`` so that handlers may pass a path to libraries that want one. Scratch directories
are made in the running front's own folder (:data:`SCRATCH_VARIABLE`,
``front/run_folder.py``), which the next start sweeps if the front was killed, else under
``TMPDIR``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Final

from abeja_runtime.errors import InsufficientStorage

__all__ = ["SCRATCH_VARIABLE", "Scratch", "Spool"]

#: The folder scratch directories are made in, set by the front for itself and its handler
#: processes (unset: ``TMPDIR``, as for ``abeja-runtime batch``).
SCRATCH_VARIABLE: Final = "ABEJA_RUNTIME_SCRATCH_DIR"

#: A full disk, or a user's disk quota used up.
_NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


class Scratch:
    """A request's lazily created temporary directory (under ``TMPDIR``)."""

    __slots__ = ("_path",)

    def __init__(self) -> None:
        self._path: str | None = None

    def new_file(self) -> IO[bytes]:
        if self._path is None:
            where = os.environ.get(SCRATCH_VARIABLE) or None
            self._path = tempfile.mkdtemp(prefix="abeja-request-", dir=where)
        return tempfile.NamedTemporaryFile(dir=self._path, delete=False)

    def remove(self) -> None:
        if self._path is not None:
            shutil.rmtree(self._path, ignore_errors=True)
            self._path = None


class Spool:
    """Collects one body's bytes; ``finish()`` returns a readable file object at offset 0."""

    __slots__ = ("_file", "_scratch", "_threshold", "size")

    def __init__(self, scratch: Scratch, threshold: int) -> None:
        self._scratch = scratch
        self._threshold = threshold
        self._file: IO[bytes] = io.BytesIO()
        self.size = 0

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        self.size += len(chunk)
        with _disk_full_is_507():
            if self.size > self._threshold and isinstance(self._file, io.BytesIO):
                in_memory = self._file
                self._file = self._scratch.new_file()
                self._file.write(in_memory.getbuffer())
            self._file.write(chunk)

    def finish(self) -> IO[bytes]:
        with _disk_full_is_507():
            self._file.seek(0)  # flushes what a spooled file still buffers
        return self._file

    def discard(self) -> None:
        self._file.close()


@contextlib.contextmanager
def _disk_full_is_507() -> Iterator[None]:
    """A full disk while spooling is the client's ``507``, not an unexpected error."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _NO_SPACE:
            raise InsufficientStorage() from None
        raise
