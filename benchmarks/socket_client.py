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


class Exchange:
    """One request's response, read as it arrives: its head, then its body (``Content-Length``,
    chunked, or up to the connection's close)."""

    def __init__(self, is_first: IsFirst) -> None:
        self._is_first = is_first
        self.answer = TimedAnswer(0, b"", 0.0, 0.0)
        self.done: asyncio.Future[TimedAnswer] = asyncio.get_running_loop().create_future()
        self.keep_alive = True
        self._raw = bytearray()  # what the socket gave and is not parsed yet
        self._body = bytearray()
        self._scanned = 0  # the body's lines before this offset were seen by is_first
        self._length: int | None = None  # None: chunked, or (until_close) up to the close
        self._chunked = self._until_close = self._in_body = False

    def received(self, data: bytes, now: float) -> None:
        """Bytes from the socket, read at ``now``: :class:`ValueError` for a response this
        client cannot read."""
        self._raw += data
        if not self._in_body and not self._head():
            return
        self._take_body()
        if not self.answer.arrived and self._first_line_seen():
            self.answer.arrived = now
        if self._complete():
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
        self.answer.status = int(rest[:3])
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in lines[1:])
        }
        self._chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        if not self._chunked and "content-length" in fields:
            self._length = int(fields["content-length"])
        self._until_close = not self._chunked and self._length is None
        connection = fields.get("connection", "").lower()
        self.keep_alive = version == "HTTP/1.1" and connection != "close" and not self._until_close
        self._in_body = True
        return True

    def _take_body(self) -> None:
        if not self._chunked:
            self._body += self._raw
            self._raw.clear()
            return
        while (line_end := self._raw.find(b"\r\n")) >= 0:
            size = int(bytes(self._raw[:line_end]).split(b";")[0], 16)
            if size == 0:  # the last chunk: the trailer section ends with an empty line
                if self._raw.find(b"\r\n\r\n", line_end) == line_end:
                    self._length, self._raw = len(self._body), bytearray()
                return
            if len(self._raw) < line_end + 2 + size + 2:
                return
            self._body += self._raw[line_end + 2 : line_end + 2 + size]
            del self._raw[: line_end + 2 + size + 2]

    def _first_line_seen(self) -> bool:
        while (end := self._body.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._body[self._scanned : end]).rstrip(b"\r")
            self._scanned = end + 1
            if self._is_first(line):
                return True
        return False

    def _complete(self) -> bool:
        return self._length is not None and len(self._body) >= self._length

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
            return  # bytes after an answer: the connection is not reused (see exchange())
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
        if exchange.keep_alive and connection.open:
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
