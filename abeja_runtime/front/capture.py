"""A request body read straight from the socket into its shared buffer, past aiohttp's parser.

Through aiohttp, each byte of a 1 MiB body was copied three times in the front (the event
loop's read buffer into a bytes object, the parser's body slice into another, that into the
shared buffer), and those copies were a third of what the front spent on the request. While a
:class:`BodyCapture` is the connection's protocol, the event loop reads the socket into the
buffer itself (``asyncio.BufferedProtocol``): the kernel's copy is the only one. Measured by
``benchmarks/probes/body_into_buffer.py``: 133-135 µs of the front's CPU per 1 MiB body against
187-202 µs through the parser.

The capture reads exactly the body's declared length, then gives the transport back to the
connection, which starts a fresh parser for the requests behind it (llhttp cannot be told to
skip a body it did not see). A client that leaves mid-body reaches the connection as always
(``connection_lost``), and so does what the front writes meanwhile (flow control).
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable
from typing import Final, Protocol

__all__ = ["BodyCapture", "CapturingConnection"]

#: Where the rest of a connection's bytes go after a capture was given up (never into a buffer
#: that may already hold another request's body). Anonymous memory: resident only once used.
_DISCARDED: Final = memoryview(mmap.mmap(-1, 64 * 1024))


class CapturingConnection(Protocol):
    """What a capture tells the connection it reads for (``connection.py``'s ``Connection``):
    it is the connection's transport's protocol meanwhile."""

    def body_progress(self) -> None:
        """Bytes of the body arrived."""

    def body_captured(self) -> None:
        """The body is whole: the connection takes its transport back."""

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class BodyCapture(asyncio.BufferedProtocol):
    """Reads ``into``'s length of body bytes into it, then calls ``done`` (after giving the
    transport back to ``connection``)."""

    __slots__ = ("_connection", "_done", "_into", "_offset", "_over")

    def __init__(
        self, connection: CapturingConnection, into: memoryview, done: Callable[[], None]
    ) -> None:
        self._connection = connection
        self._into = into
        self._offset = 0
        self._done = done
        self._over = False

    @property
    def received(self) -> int:
        """The body's bytes read into the buffer so far."""
        return self._offset

    @property
    def arriving(self) -> bool:
        """Bytes are still expected (neither complete nor given up)."""
        return not self._over

    def give_up(self) -> None:
        """Stop writing into the buffer (the request failed, or its client left); the rest of
        the connection's bytes are dropped until it closes."""
        self._over = True
        self._into.release()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._over:
            return _DISCARDED
        return self._into[self._offset :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._over:
            return
        self._connection.body_progress()
        self._offset += nbytes
        if self._offset == len(self._into):
            self.give_up()
            self._connection.body_captured()
            self._done()

    def eof_received(self) -> bool:
        """The client stopped sending before the body's end: the connection closes."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._over:
            self.give_up()
        self._connection.connection_lost(exc)

    def pause_writing(self) -> None:
        self._connection.pause_writing()

    def resume_writing(self) -> None:
        self._connection.resume_writing()
