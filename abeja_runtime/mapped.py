"""Request bodies in shared memory: the front writes them, a handler process reads them in place.

A body between the inline limit (64 KiB) and the spool threshold travels as the descriptor of
one of the front's memfds (:class:`BodyBuffers`), which the front keeps mapped and reuses from
call to call: a body is one copy into pages that stay in place. A fresh memfd per body cost
200 µs per MiB in page faults, on both sides; the socket itself more. A handler process maps
each buffer the front may fill again once (:class:`SharedBodies`) and gives the handler a
read-only binary file over the body's bytes (:class:`MappedBody`): the handler's own reads are
the only copies there. A buffer the front does not keep (above its 32 MiB of free buffers) is
unmapped with its body: the mapping would otherwise be all that held its memory.

The file is closed after the call, as every request file is; the front reuses the buffer once
the call is answered, so a handler must not keep the file open beyond its call (reads after
``close()`` raise ``ValueError``, as on any closed file).
"""

from __future__ import annotations

import collections
import contextlib
import io
import mmap
import os
import threading
from typing import IO, Final, cast

from abeja_runtime.frames import anonymous_file

__all__ = ["BodyBuffers", "MappedBody", "SharedBodies"]


class BodyBuffers:
    """The front's buffers: memfds, each mapped, filled by one body at a time."""

    #: Free buffers are kept up to this many bytes in all; a busier moment makes more, and
    #: closes them after. (Measured: keeping 8 made the front make and drop buffers all the
    #: time with 16 clients sending 1 MiB each, a third of each request's work.)
    _KEPT_BYTES: Final = 32 * 1024 * 1024
    #: The smallest buffer made: a buffer serves every body up to its size.
    _SMALLEST: Final = 1024 * 1024

    def __init__(self) -> None:
        self._free: list[tuple[int, mmap.mmap]] = []
        self._free_bytes = 0
        self._busy: dict[int, mmap.mmap] = {}

    def fill(self, chunks: list[bytes], size: int) -> int:
        """A buffer holding ``chunks`` from offset 0: its descriptor, until :meth:`release`."""
        fd, mapped = self.take(size)
        offset = 0
        for chunk in chunks:
            mapped[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        return fd

    def take(self, size: int) -> tuple[int, mmap.mmap]:
        """A buffer of at least ``size`` bytes to fill: its descriptor and mapping, until
        :meth:`release`."""
        for index, (fd, mapped) in enumerate(self._free):  # noqa: B007 (used after the loop)
            if len(mapped) >= size:
                del self._free[index]
                self._free_bytes -= len(mapped)
                break
        else:
            fd = anonymous_file()
            capacity = max(size, self._SMALLEST)
            os.ftruncate(fd, capacity)
            mapped = mmap.mmap(fd, capacity)
        self._busy[fd] = mapped
        return fd, mapped

    def release(self, fd: int) -> None:
        mapped = self._busy.pop(fd)
        if self._free_bytes + len(mapped) <= self._KEPT_BYTES:
            self._free.append((fd, mapped))
            self._free_bytes += len(mapped)
        else:
            mapped.close()
            os.close(fd)


class MappedBody(io.RawIOBase):
    """The first ``size`` bytes of a mapping, as a read-only, seekable binary file; closing it
    also closes the mapping when the file ``owns`` it."""

    def __init__(self, mapped: mmap.mmap, size: int, *, owns: bool = False) -> None:
        super().__init__()
        self._mapped: mmap.mmap | None = mapped
        self._view: memoryview | None = memoryview(mapped)[:size]
        self._size = size
        self._owns = owns
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _open_view(self) -> memoryview:
        if self._view is None:
            raise ValueError("I/O operation on closed file.")
        return self._view

    def read(self, size: int | None = -1) -> bytes:
        view = self._open_view()
        start = self._position
        end = self._size if size is None or size < 0 else min(self._size, start + size)
        self._position = max(start, end)
        return bytes(view[start:end])

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        self._open_view()
        assert self._mapped is not None, "dropped only with the view"
        start = self._position
        end = self._mapped.find(b"\n", start, self._size)
        end = self._size if end < 0 else end + 1
        if size is not None and size >= 0:
            end = min(end, start + size)
        return self.read(end - start)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._open_view()
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        self._open_view()
        return self._position

    def close(self) -> None:
        if self._view is not None:
            self._view.release()
            self._view = None
        mapped, self._mapped = self._mapped, None
        if mapped is not None and self._owns:
            mapped.close()
        super().close()


class SharedBodies:
    """The front's body buffers as a handler process maps them.

    A buffer the front may fill again stays mapped here, so that its next body is read out of
    pages already mapped, not through a mapping and its page faults per call (measured: a 1 MiB
    body read whole in 70-80 µs from a kept mapping, in 130-150 µs through a fresh one). The
    mappings kept are bounded by their bytes, the least recently used closed first.

    A buffer above what the front keeps free (``BodyBuffers``: 32 MiB in all) is never filled
    again: the front closes it once its call is over, and a mapping kept here was then all that
    held its memory, until the process exited (after forty 50 MiB gRPC messages, each of two
    handler processes held 1 GiB of shared memory). Such a buffer is mapped for its body alone
    and unmapped when the body is closed.
    """

    #: The largest buffer kept mapped: the front keeps no bigger one for another body.
    _REUSED_UP_TO: Final = BodyBuffers._KEPT_BYTES
    #: Bytes of mappings kept: twice what the front keeps free, for the buffers its calls hold
    #: meanwhile (64 buffers of the smallest size, 1 MiB).
    _KEPT_BYTES: Final = 2 * BodyBuffers._KEPT_BYTES

    def __init__(self) -> None:
        self._mapped: collections.OrderedDict[tuple[int, int], mmap.mmap] = (
            collections.OrderedDict()
        )
        self._mapped_bytes = 0
        self._lock = threading.Lock()  # handler threads build their requests themselves

    def open(self, fd: int, size: int) -> IO[bytes]:
        """The first ``size`` bytes of the buffer ``fd`` (closed here), as a file."""
        try:
            status = os.fstat(fd)
            if status.st_size > self._REUSED_UP_TO:
                mapped = mmap.mmap(fd, status.st_size, prot=mmap.PROT_READ)
                return cast(IO[bytes], MappedBody(mapped, size, owns=True))
            with self._lock:  # the body's view taken before another body may drop the mapping
                return cast(IO[bytes], MappedBody(self._kept(fd, status), size))
        finally:
            os.close(fd)

    def _kept(self, fd: int, status: os.stat_result) -> mmap.mmap:
        """The buffer's mapping, made now unless it is kept, and kept for its next body (under
        the lock)."""
        key = (status.st_dev, status.st_ino)  # unique while mapped: the mapping holds the file
        mapped = self._mapped.get(key)
        if mapped is None:
            mapped = self._mapped[key] = mmap.mmap(fd, status.st_size, prot=mmap.PROT_READ)
            self._mapped_bytes += len(mapped)
            self._drop_beyond_kept()
        self._mapped.move_to_end(key)
        return mapped

    def _drop_beyond_kept(self) -> None:
        """Close the least recently used mappings beyond :attr:`_KEPT_BYTES` (a buffer kept is
        smaller: the newest mapping is never dropped)."""
        while self._mapped_bytes > self._KEPT_BYTES:
            _, dropped = self._mapped.popitem(last=False)
            self._mapped_bytes -= len(dropped)
            # A body still open on it: the mapping goes with that body.
            with contextlib.suppress(BufferError):
                dropped.close()
