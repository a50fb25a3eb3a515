"""A big answer's body left in the memfd its handler process wrote it to (:class:`AnswerFile`).

An answer's body above :data:`ANSWER_FILE_ABOVE` bytes, or a streamed chunk above the frames'
inline limit, stays in its file and is written to the client a piece at a time as the client
takes it, rather than read whole into the front.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import ClassVar, Final

__all__ = ["ANSWER_FILE_ABOVE", "AnswerFile"]

#: An answer's body above this many bytes is written from its file (four clients that never
#: read a 200 MiB answer would otherwise hold 800 MiB of the front).
ANSWER_FILE_ABOVE: Final = 1024 * 1024
#: The size of the pieces it is written in.
_PIECE: Final = 256 * 1024


class AnswerFile:
    """A body in a memfd, read a piece at a time (``pread``: no mapping that a transport could
    still hold when the file is closed)."""

    __slots__ = ("_fd", "size")

    #: How many are open in this process: each holds a descriptor, which the connection cap
    #: counts (``web_server.py``).
    held: ClassVar[int] = 0

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self.size = os.fstat(fd).st_size
        AnswerFile.held += 1

    def pieces(self) -> Iterator[bytes]:
        """The body in pieces, read as they are asked for."""
        offset = 0
        while offset < self.size and self._fd is not None:
            piece = os.pread(self._fd, min(_PIECE, self.size - offset), offset)
            if not piece:
                return
            offset += len(piece)
            yield piece

    async def chunks(self) -> AsyncIterator[bytes]:
        """:meth:`pieces` for the writers of streamed answers, which also write these."""
        for piece in self.pieces():
            yield piece

    def read(self) -> bytes:
        """The whole body (an async request's result, sent in one request)."""
        return b"".join(self.pieces())

    def close(self) -> None:
        """Once: a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            AnswerFile.held -= 1
            os.close(fd)
