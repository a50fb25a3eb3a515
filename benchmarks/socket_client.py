"""A keep-alive HTTP/1.1 client that times a streamed answer at the socket, as wrk times its
requests: the benchmarks' measure of what a server adds, with no client library's work in it.

A stream's times are taken where the server's work shows: ``sent`` just before the request is
written to the socket, ``arrived`` at the read that completed the first line of the body that
the caller's ``is_first`` accepts. Everything else (parsing the head, undoing the chunked
framing, checking the answer) happens after those stamps. With an HTTP client library the same
stream also counts the library building the request and parsing the response on the client's
core: about half a millisecond on this machine's benchmark (``RESULTS.md``), for any server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Exchange", "SocketClient", "TimedAnswer"]

#: Whether a line of the body (without its newline) is the one whose arrival is timed.
IsFirst = Callable[[bytes], bool]


@dataclass
class TimedAnswer:
    """A whole response and its stamps (``time.time()``); ``arrived`` is 0.0 when no line of
    the body was the first one sought."""

    status: int
    body: bytes
    sent: float
    arrived: float


#: How much of a chunk is still to come: its size line, or (0) the CRLF after its data.
_SIZE_LINE = -1
#: Statuses whose answers have no body, whatever their head says.
_NO_BODY = (204, 304)


class Exchange:
    """One request's response, read as it arrives: its head, then its body (``Content-Length``,
    chunked, or up to the connection's close). Each piece of the body is taken as it comes,
    also a chunk's data before the rest of that chunk, so that a line is seen at the read that
    completed it."""

    def __init__(self, is_first: IsFirst) -> None:
        self._is_first = is_first
        self.answer = TimedAnswer(0, b"", 0.0, 0.0)
        self.done: asyncio.Future[TimedAnswer] = asyncio.get_running_loop().create_future()
        #: The connection may take the next request: HTTP/1.1, not closed, nothing after the
        #: answer's end.
        self.keep_alive = True
        self._raw = bytearray()  # what the socket gave and is not parsed yet
        self._body = bytearray()
        self._scanned = 0  # the body's lines before this offset were seen by is_first
        self._left: int | None = None  # the body still to come; None: chunked, or up to the close
        self._chunk_left = _SIZE_LINE
        self._chunked = self._until_close = self._in_body = False

    def received(self, data: bytes, now: float) -> None:
        """Bytes from the socket, read at ``now``: :class:`ValueError` for a response this
        client cannot read."""
        self._raw += data
        if not self._in_body and not self._head():
            return
        ended = self._take_chunks() if self._chunked else self._take_bytes()
        if not self.answer.arrived and self._first_line_seen():
            self.answer.arrived = now
        if ended:
            if self._raw:  # bytes after the answer's end: the connection is not reused
                self.keep_alive = False
            self._finish()

    def closed(self) -> None:
        """The connection closed: the end of a body read up to it, else a failure."""
        if self.done.done():
            return
        if self._in_body and self._until_close:
            self._finish()
        else:
            self.done.set_exception(ConnectionResetError("the server closed the connection"))

    def _head(self) -> bool:
        end = self._raw.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self._raw[:end]).decode("latin-1").split("\r\n")
        del self._raw[: end + 4]
        version, _, rest = lines[0].partition(" ")
        if not version.startswith("HTTP/1."):
            raise ValueError(f"not a status line: {lines[0][:100]!r}")
        self.answer.status = int(rest[:3])
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }
        if self.answer.status in _NO_BODY:
            self._left = 0
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            self._chunked = True
        elif "content-length" in fields:
            self._left = int(fields["content-length"])
        self._until_close = not self._chunked and self._left is None
        connection = fields.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and connection != "close" and not self._until_close
        self._in_body = True
        return True

    def _take_bytes(self) -> bool:
        """A body of a length, or up to the close: whether it is whole."""
        taken = self._raw if self._left is None else self._raw[: self._left]
        self._body += taken
        del self._raw[: len(taken)]
        if self._left is None:
            return False
        self._left -= len(taken)
        return self._left == 0

    def _take_chunks(self) -> bool:
        """A chunked body: whether its last chunk and trailer section came."""
        raw = self._raw
        while raw:
            if self._chunk_left > 0:  # the chunk's data, as much as came
                taken = raw[: self._chunk_left]
                self._body += taken
                del raw[: len(taken)]
                self._chunk_left -= len(taken)
            elif self._chunk_left == 0:  # the CRLF that ends a chunk's data
                if len(raw) < 2:
                    return False
                if raw[:2] != b"\r\n":
                    raise ValueError("a chunk's data is not followed by CRLF")
                del raw[:2]
                self._chunk_left = _SIZE_LINE
            else:
                line_end = raw.find(b"\r\n")
                if line_end < 0:
                    return False
                size = int(bytes(raw[:line_end]).split(b";")[0], 16)
                if size == 0:  # the last chunk; its trailer section ends with an empty line
                    end = raw.find(b"\r\n\r\n", line_end)
                    if end < 0:
                        return False
                    del raw[: end + 4]
                    return True
                del raw[: line_end + 2]
                self._chunk_left = size
        return False

    def _first_line_seen(self) -> bool:
        while (end := self._body.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._body[self._scanned : end]).rstrip(b"\r")
            self._scanned = end + 1
            if self._is_first(line):
                return True
        return False

    def _finish(self) -> None:
        self.answer.body = bytes(self._body)
        self.done.set_result(self.answer)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one exchange at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.open = True

    def data_received(self, data: bytes) -> None:
        now = time.time()
        exchange = self.exchange
        if exchange is None or exchange.done.done():
            self.close()  # bytes nobody asked for: the connection is not reused
            return
        try:
            exchange.received(data, now)
        except ValueError as exc:
            exchange.done.set_exception(ConnectionError(f"an unreadable response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.exchange is not None:
            self.exchange.closed()

    def closing(self) -> bool:
        """Closed, or about to be: a write would fail."""
        return self.transport is None or self.transport.is_closing()

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()


class SocketClient:
    """Keep-alive connections to one server, reused last in first out and opened as needed."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._idle: list[_Connection] = []

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """A ``POST`` request's bytes, to build once and send many times."""
        head = [f"POST {path} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    async def exchange(self, request: bytes, is_first: IsFirst) -> TimedAnswer:
        """Send ``request`` and read its whole response; a connection whose exchange failed
        or was cancelled (a timeout) is closed, never reused."""
        connection = await self._connection()
        assert connection.transport is not None
        connection.exchange = exchange = Exchange(is_first)
        try:
            exchange.answer.sent = time.time()
            connection.transport.write(request)
            answer = await exchange.done
        except BaseException:
            connection.close()
            raise
        connection.exchange = None
        if exchange.keep_alive and connection.open and not connection.closing():
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    async def _connection(self) -> _Connection:
        """An idle connection the server has not closed, else a new one."""
        while self._idle:
            connection = self._idle.pop()
            if connection.open and not connection.closing():
                return connection
        return await self._open()

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        transport, connection = await loop.create_connection(_Connection, self._host, self._port)
        connection.transport = transport  # uvloop may call connection_made after the return
        return connection

    @property
    def idle(self) -> int:
        """How many idle connections are kept that the server has not closed."""
        return sum(1 for connection in self._idle if connection.open)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
