"""The front's HTTP connections: aiohttp's connection handler, with what it does not do itself.

* Malformed HTTP (header floods, bad request lines) is answered as ``{"status": ...}`` JSON, as
  the contract wants every error, instead of aiohttp's text/plain, with one warning line (not
  aiohttp's error record and its traceback) and counted in the metrics.
* A request head may take at most ``max_head_size`` bytes (``--max-head-size``), counted as
  they arrive once the connection awaits a request: the parser is given no more of it, the
  client is answered ``431`` and the connection closed (:class:`_RefusedHead`). aiohttp's own
  limits (8190 bytes a line, 128 header lines) let each connection hold 1 MiB of head, which
  the front kept: 500 such connections took it from 39 to 1,032 MiB. The bytes of a head
  pipelined behind a request (in the same read, or while that request is served) are not
  counted; aiohttp's own limits bound those.
* A request head must arrive whole within ``head_timeout`` of its first byte (or of the
  connection, for the first request): a client trickling its request line and headers
  (slowloris) is answered ``408`` and cut off. aiohttp's keep-alive timer covers idle
  connections, but not one that keeps sending a byte now and then.
* A body being read must make progress: no byte for ``head_timeout`` seconds fails its reading
  with :class:`~abeja_runtime.errors.BodyTimeout` (``408``, the connection closed), where
  aiohttp would wait for ever.
* The service port keeps at most :func:`connection_cap` connections open (what the open-files
  limit leaves after the front's own needs), counting as one more each big answer a slow
  client is still taking (its memfd, :class:`~abeja_runtime.front.pending.AnswerFile`); one
  more is answered ``503`` and closed, so that idle clients can never take the descriptors the
  health port needs to answer its probes.
* **The direct path.** A request that came whole with its head (nearly every model call: a
  JSON or an image body of up to 64 KiB, over HTTP/1.1) is handed to a :class:`DirectPath`
  as soon as aiohttp's parser has it, and answered from a callback when its handler process
  answers: no request object, no task, no response object. That is half of what the front
  costs per request (measured: 47 → 24 µs of CPU per small JSON request). The direct path
  takes a larger body with a ``Content-Length`` too: the connection reads it straight from
  the socket into a buffer (:meth:`Connection.capture_body`), or holds it unread while it
  waits for a place (:meth:`Connection.hold_body`). Everything else (a chunked body,
  HTTP/1.0, an upgrade, a parse error, a request behind one aiohttp is serving) goes through
  aiohttp's own request handling, in order: the direct path only takes a request while
  aiohttp waits for one (or before its loop has begun), and wakes it for the first one it
  leaves.
"""

from __future__ import annotations

import asyncio
import http
import logging
import mmap
import re
import resource
import time
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple, Protocol

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader

from abeja_runtime.config import Config
from abeja_runtime.encode import status_body, status_reply
from abeja_runtime.errors import (
    BodyCannotArriveInTime,
    BodyTimeout,
    BodyTooSlow,
    HeadTooLarge,
    HttpError,
)
from abeja_runtime.front.aiohttp_private import HandlerInternals
from abeja_runtime.front.body_gate import BODIES_AHEAD
from abeja_runtime.front.capture import BodyCapture
from abeja_runtime.front.pending import AnswerFile
from abeja_runtime.metrics import FrontMetrics

__all__ = [
    "MIN_BODY_RATE",
    "Connection",
    "DirectCall",
    "DirectPath",
    "connection_cap",
    "make_web_server",
]

#: Bytes a second a body must average while it holds one of the front's places for bodies
#: (from ``--request-head-timeout`` after it took the place): a trickle far below any real
#: network, that held every place with a byte every few seconds.
MIN_BODY_RATE: Final = 1024
#: A body that holds a place is judged by its rate from this many seconds on, at most every
#: as many: one that could not be whole by its deadline at twice its rate is cut then.
_RATE_JUDGED_AFTER: Final = 1.0


class _Watch(NamedTuple):
    """A body being read (see :meth:`Connection.watch_body`)."""

    arriving: Callable[[], bool]
    stalled: Callable[[BaseException], None]
    #: Its bytes so far, for the rate (``None``: no rate is judged).
    received: Callable[[], int] | None
    #: Its length, when it is known, and when its request's deadline passes (loop time).
    expected: int | None
    deadline: float | None
    #: When the watch began, and the bytes received then.
    began: float
    at_start: int


_log = logging.getLogger("abeja_runtime")


class DirectCall(Protocol):
    """A request the direct path is serving on a connection."""

    def client_gone(self) -> None:
        """The connection was lost before the answer was written."""


class DirectPath(Protocol):
    """Serves the simple requests of a connection without aiohttp's request handling."""

    def accepts(
        self, connection: Connection, message: RawRequestMessage, payload: StreamReader
    ) -> int | None:
        """Whether this request (its head parsed, its body complete or not) is one to take:
        ``None`` if not, else what :meth:`take` is to be given with it (the size of a body
        still to read; ``0``, the body is whole)."""

    def take(
        self,
        connection: Connection,
        message: RawRequestMessage,
        payload: StreamReader,
        captured: int,
    ) -> DirectCall:
        """Start serving the request (it may be answered at once). The answer is given with
        :meth:`Connection.send_direct`, and :meth:`Connection.direct_done` ends the call."""


class _Taking:
    """The direct call of a connection while the direct path takes its request."""

    def client_gone(self) -> None:
        pass


_TAKING: Final = _Taking()


class Connection(HandlerInternals):
    """One client connection of the service port (or of the health port, without a direct
    path); see the module's docstring. aiohttp's private state is reached only through
    :class:`~abeja_runtime.front.aiohttp_private.HandlerInternals` (the ``aio_*`` names)."""

    def __init__(
        self,
        manager: web.Server,
        *,
        head_timeout: float,
        direct: DirectPath | None,
        parser_options: dict[str, Any],
        max_connections: int | None,
        max_head_size: int,
        metrics: FrontMetrics,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._max_connections = max_connections
        self._metrics = metrics
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False
        self._max_head_size = max_head_size
        #: Bytes the head being received may still take: ``max_head_size`` less what came of it
        #: while the connection awaited it; never below 0 (a read longer than the room goes
        #: through :meth:`_parse_head_room`).
        self._head_room = max_head_size
        #: When bytes last arrived, and the watch over a body being read (see watch_body).
        self._last_data = 0.0
        self._body_timer: asyncio.TimerHandle | None = None
        self._watched: _Watch | None = None
        self._direct = direct
        self._direct_call: DirectCall | None = None
        #: aiohttp's request loop (start) has begun.
        self._aiohttp_started = False
        #: aiohttp's request loop serves a request (see aiohttp_serves).
        self._aiohttp_serving = False
        #: What aiohttp made its parser with, for the fresh one after a captured body.
        self._parser_options = parser_options

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        most = self._max_connections
        if most is not None and self.open_connections() + AnswerFile.held > most:
            # Each connection holds a descriptor, and so does each big answer a slow client
            # is still taking (its memfd): past the cap, the health port could not accept its
            # probes, nor the front open a body's buffer.
            if self.transport is not None:
                self.transport.write(_TOO_MANY_CONNECTIONS_RESPONSE)
            self.force_close()
            _warn_too_many_connections(most)
            return
        self._arm_head_timer()

    async def start(self) -> None:
        self._aiohttp_started = True
        if self._direct_call is not None:
            # The direct path took the first request before this loop began: aiohttp's turn
            # comes when it leaves one (as when aiohttp waits for a request).
            await self.wait_as_idle()
        await super().start()

    def data_received(self, data: bytes) -> None:
        self._last_data = self.event_loop.time()
        if len(data) > self._head_room and self._awaiting_head() and not self._ends_head(data):
            # Rare: a head past its limit, or one whose end is in a later read.
            rest = self._parse_head_room(data)
            if rest is None:
                return
            data = rest
        waiter = self.aio_waiter
        if self._direct is not None and (
            (waiter is not None and not waiter.done()) or not self._aiohttp_started
        ):
            # aiohttp waits for a request, or its loop has not begun (on Python 3.11 it starts
            # on the next iteration, often after the first request came): it is woken only
            # for one the direct path leaves.
            self.aio_waiter = None
            try:
                super().data_received(data)
            finally:
                self.aio_waiter = waiter
            taken = self._take_requests()
        else:
            super().data_received(data)
            taken = False
        if taken or self.aio_messages or self.aio_current_request is not None or self._direct_call:
            self._disarm_head_timer()  # a whole head arrived
        elif data:
            if self._awaiting_head():  # else a body aiohttp is about to read
                self._head_room -= len(data)
            self._head_started = True
            self._arm_head_timer()

    def _awaiting_head(self) -> bool:
        """The bytes arriving now begin or continue a request head: the connection is open, speaks
        HTTP, and no request of it is being served or waits."""
        return not (
            self.aio_messages
            or self._aiohttp_serving
            or self._direct_call is not None
            or self.aio_force_close
            or self.aio_upgraded
        )

    def aiohttp_serves(self) -> None:
        """aiohttp's request loop took a request off the queue (its handler begins later, and
        its body may still be arriving)."""
        self._aiohttp_serving = True

    def log_access(
        self, request: web.BaseRequest, response: web.StreamResponse, time: float | None
    ) -> None:
        """aiohttp calls this once a request it served is answered (its answer written whole,
        or its client gone)."""
        self._aiohttp_serving = False
        super().log_access(request, response, time)

    def _ends_head(self, data: bytes) -> bool:
        """Whether the head being received surely ends within its room in ``data``: an empty line
        there, after the first of its other bytes (empty lines before a request line are
        skipped, as llhttp skips them). A head whose end straddles two reads is not seen here;
        :meth:`_parse_head_room` then finds where it ends."""
        room = self._head_room
        begun = _NOT_EMPTY_LINE.search(data, 0, room)
        return begun is not None and data.find(b"\r\n\r\n", begun.start(), room) >= 0

    def _parse_head_room(self, data: bytes) -> bytes | None:
        """Parse as much of ``data`` as the head being received may still take. When the head
        ended within it, the rest of ``data`` is returned, to be received as usual (the direct
        path looks at the parsed request once all is parsed, as if ``data`` had been parsed in
        one go); else the head is refused (``431``) and ``None`` returned."""
        room = self._head_room
        waiter = self.aio_waiter
        if self._direct is not None:
            self.aio_waiter = None  # the direct path has the first look, as in data_received
        try:
            super().data_received(data[:room])
        finally:
            self.aio_waiter = waiter
        if not self.aio_messages:  # not even a parse error: the head goes on
            self._refuse_head()
            return None
        return data[room:]

    def _refuse_head(self) -> None:
        """Answer ``431`` to a head longer than ``max_head_size``; the connection handler's part
        is over (:class:`_RefusedHead` ends the connection)."""
        transport = self.transport
        assert transport is not None  # open: it awaited a head
        self._disarm_head_timer()
        self._metrics.rejected_head("too_large")
        _log.warning(
            "a request head from %s went past %d bytes; answered 431 (the limit is "
            "ABEJA_RUNTIME_MAX_HEAD_SIZE, --max-head-size)",
            _peer(transport),
            self._max_head_size,
        )
        refusal = HeadTooLarge(self._max_head_size)
        transport.write(_closing_answer(refusal.status, refusal.message))
        transport.set_protocol(_RefusedHead(self, transport))
        self.transport = None  # aiohttp's request loop ends, and writes nothing more
        self.force_close()

    def _take_requests(self) -> bool:
        """Serve the parsed requests from the first on, one at a time, while the direct path
        takes them; wake aiohttp for the first it leaves. Whether any was taken.

        A client may pipeline more requests than aiohttp's queue holds: reading is then held
        (``aio_buffer_paused``) until the queue drains, which aiohttp's own loop would see to;
        here :meth:`~abeja_runtime.front.aiohttp_private.HandlerInternals.release_queue_hold`
        does, while the connection is busy (a parse then queues requests, takes none)."""
        direct = self._direct
        assert direct is not None
        taken = False
        messages = self.aio_messages
        while self._direct_call is None and not self.aio_force_close:
            if not messages:
                if not self.aio_buffer_paused:
                    break
                self._direct_call = _TAKING
                try:
                    self.release_queue_hold()
                finally:
                    if self._direct_call is _TAKING:
                        self._direct_call = None
                if not messages:
                    break
                continue
            message, payload = messages[0]
            captured = (
                direct.accepts(self, message, payload)
                if isinstance(message, RawRequestMessage)
                else None
            )
            if captured is None:
                waiter = self.aio_waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                break
            self.pop_message()
            taken = True
            # Busy while it is taken: reading its body may resume the transport's reading,
            # which parses (and would take) the requests behind it.
            self._direct_call = _TAKING
            call = direct.take(self, message, payload, captured)
            if self._direct_call is _TAKING:  # else answered at once (direct_done)
                self._direct_call = call
            if self.aio_buffer_paused and self._direct_call is not None:
                self.release_queue_hold()
        return taken

    def send_direct(self, data: bytes, body: bytes = b"") -> None:
        """Write a direct answer (its head and body)."""
        transport = self.transport
        if transport is None:
            return
        if len(body) <= _JOIN_BELOW:
            transport.write(data + body)
        else:
            transport.writelines((data, body))

    def direct_done(self, *, close: bool) -> None:
        """The direct call's answer is written: the next request, or the end (``close``)."""
        taking = self._direct_call is _TAKING  # answered within take(): its loop goes on
        self._direct_call = None
        if close:
            self.force_close()  # the transport closes once what was written is sent
            return
        if self.aio_force_close or self.transport is None:
            return
        self.arm_keepalive()
        if not taking:
            self._take_requests()

    def resume_reading(self, resume_parser: bool = True) -> None:
        """aiohttp calls this each time a body is read below its low-water mark, and it then
        parses the buffer again (one more ``data_received``) even when reading was never
        paused: only a paused connection has anything to resume."""
        if self.aio_reading_paused:
            super().resume_reading(resume_parser)

    def keepalive_deferred(self) -> bool:
        return self._direct_call is not None  # not idle: armed again when the answer is out

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._watched = None
        call, self._direct_call = self._direct_call, None
        if call is not None:
            call.client_gone()
        super().connection_lost(exc)

    @property
    def fresh(self) -> bool:
        """Accepted, and not a byte received yet: a request is on its way (or the client
        will be cut off at ``head_timeout``)."""
        return self._last_data == 0.0

    def capture_body(
        self, payload: StreamReader, into: mmap.mmap, size: int, done: Callable[[], None]
    ) -> BodyCapture | None:
        """Read the current request's ``size``-byte body into ``into``: what the parser has of
        it now, then the rest straight from the socket (:mod:`~abeja_runtime.front.capture`),
        then ``done()``. ``None`` when the body was whole already (``done`` is not called).

        Only for a request taken when :meth:`can_capture` said so.
        """
        offset = 0
        for chunk in self._parsed_body(payload):
            into[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        if payload.is_eof():
            return None
        # Every byte received so far is parsed (reading is on): the rest is to come.
        assert self.transport is not None and not self.aio_reading_paused
        capture = BodyCapture(self, memoryview(into)[offset:size], done)
        self.transport.set_protocol(capture)
        return capture

    def hold_body(self, payload: StreamReader) -> None:
        """Read no more of the current request's body until it is captured: a body waiting
        for a place stays in the socket (and the client), not in the front's memory, and
        it is then read straight into its buffer rather than through the parser."""
        if not payload.is_eof() and not self.aio_reading_paused:
            self.pause_reading()

    def _parsed_body(self, payload: StreamReader) -> Iterator[bytes]:
        """What the parser has of the current request's body, piece by piece, until every
        byte received is taken and reading is on again (a paused parser keeps what came after
        a full payload buffer in its own tail, and parses it when reading resumes)."""
        while True:
            while chunk := payload.read_nowait(-1):
                yield chunk
            if payload.is_eof() or not self.aio_reading_paused:
                return
            self.resume_reading()

    def can_capture(self) -> bool:
        """Whether a body still arriving can be captured: the connection is open and not held
        for a full message queue (a paused payload buffer is resumed by the capture itself)."""
        transport = self.transport
        return (
            transport is not None
            and not transport.is_closing()
            and not self.aio_buffer_paused
            and not self.aio_force_close
            and not self.aio_upgraded
        )

    def body_progress(self) -> None:
        """Bytes of a captured body arrived (the stall watch looks at when)."""
        self._last_data = self.event_loop.time()

    def body_captured(self) -> None:
        """The captured body is whole: the connection reads again, with a fresh parser (the
        old one is still waiting for the body's bytes)."""
        assert self.transport is not None
        self.transport.set_protocol(self)
        self.replace_parser(self._parser_options)

    def watch_body(
        self,
        arriving: Callable[[], bool],
        stalled: Callable[[BaseException], None],
        received: Callable[[], int] | None = None,
        expected: int | None = None,
        time_left: float | None = None,
    ) -> None:
        """Call ``stalled`` with :class:`~abeja_runtime.errors.BodyTimeout` if no byte of the
        body arrives for ``head_timeout`` while it is ``arriving()``; and, for a body that
        holds a place (``received()``: its bytes so far), from :data:`_RATE_JUDGED_AFTER`
        seconds on, with :class:`~abeja_runtime.errors.BodyCannotArriveInTime` when its
        ``expected`` length could not be whole within ``time_left`` (its deadline) even at
        twice its average rate, and with :class:`~abeja_runtime.errors.BodyTooSlow` when,
        ``head_timeout`` or more after the watch began, it has arrived slower than
        :data:`MIN_BODY_RATE` on average.

        One timer per connection, which looks at when bytes last came (a float that
        ``data_received`` sets) rather than being reset for every packet, and at the body
        watched now (a timer armed for an earlier body serves the next one).
        """
        now = self.event_loop.time()
        self._last_data = now
        deadline = None if time_left is None else now + time_left
        at_start = received() if received else 0
        self._watched = _Watch(arriving, stalled, received, expected, deadline, now, at_start)
        if self._body_timer is None:
            first = self._head_timeout
            if received is not None and expected is not None and deadline is not None:
                first = min(first, _RATE_JUDGED_AFTER)
            self._body_timer = self.event_loop.call_later(first, self._check_body)

    def _check_body(self) -> None:
        self._body_timer = None
        watched = self._watched
        if watched is None:
            return
        if not watched.arriving():
            self._watched = None
            return
        now = self.event_loop.time()
        idle = now - self._last_data
        if idle >= self._head_timeout:
            self._watched = None
            watched.stalled(BodyTimeout(self._head_timeout))
            return
        watched_for = now - watched.began
        late = _too_slow(watched, now, self._head_timeout)
        if late is not None:
            self._watched = None
            watched.stalled(late)
            return
        next_look = max(0.0, self._head_timeout - watched_for) or 1.0
        if watched.expected is not None and watched.deadline is not None:
            next_look = _RATE_JUDGED_AFTER
        self._body_timer = self.event_loop.call_later(
            min(self._head_timeout - idle, next_look), self._check_body
        )

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.event_loop.call_later(self._head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._head_started:  # (its room is whole unless a part of a head came)
            self._head_started = False
            self._head_room = self._max_head_size

    def _head_timed_out(self) -> None:
        self._head_timer = None
        busy = self.aio_messages or self.aio_current_request is not None or self._direct_call
        if busy or self.transport is None:
            return
        if self._head_started:  # a partial request: it can still be told why
            self.transport.write(_HEAD_TIMEOUT_RESPONSE)
            self._metrics.rejected_head("timeout")
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer to a request aiohttp's parser could not read (``400``: said in one
        warning line, and counted) or whose service failed (aiohttp logs it, with its
        traceback)."""
        if status == 400:
            why = message or str(exc or "bad request")
            text = f"malformed HTTP request: {why}"
            self._metrics.rejected_head("malformed")
            # aiohttp's message: what was wrong on its first line, the bytes on the next ones.
            said = why.partition("\n")[0].rstrip(":")[:_REASON_LOGGED]
            _log.warning("malformed HTTP request from %s; answered 400: %s", request.remote, said)
        else:
            super().handle_error(request, status, exc, message)
            text = "unexpected error occurred"
        reply = status_reply(status, text)
        assert isinstance(reply.body, bytes)
        error = web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        error.force_close()
        return error


class _RefusedHead(asyncio.Protocol):
    """A connection whose head was refused, from its answer to its close, in place of the
    connection handler: the answer is followed by the end of the stream; what the client still
    sends is read and dropped, at most :data:`_REFUSED_HEAD_READ` bytes for at most
    :data:`_REFUSED_HEAD_WAIT` seconds, so that a client still sending its head reads its
    answer rather than a reset (a socket closed with bytes unread is reset); then it closes."""

    def __init__(self, connection: Connection, transport: asyncio.Transport) -> None:
        self._connection = connection
        self._transport = transport
        self._left = _REFUSED_HEAD_READ
        self._closing = connection.event_loop.call_later(_REFUSED_HEAD_WAIT, transport.close)
        transport.write_eof()  # once the answer is sent

    def data_received(self, data: bytes) -> None:
        self._left -= len(data)
        if self._left <= 0:
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing.cancel()
        self._connection.connection_lost(exc)


#: What a client whose head was refused may still send before its connection is closed.
_REFUSED_HEAD_READ: Final = 1024 * 1024
_REFUSED_HEAD_WAIT: Final = 1.0
#: The first byte that is not of the empty lines the parser skips before a request line.
_NOT_EMPTY_LINE: Final = re.compile(rb"[^\r\n]")
#: The most of a parse error's reason that its warning line says.
_REASON_LOGGED: Final = 200


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


def _closing_answer(status: int, message: str, *extra_headers: str) -> bytes:
    """An answer written straight to the transport, before or instead of aiohttp's request
    handling: ``{"status": message}`` JSON, and the connection closed after it."""
    body = status_body(message)
    head = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "Content-Type: application/json",
        *extra_headers,
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


#: A direct answer's head and body go out in one write below this size (one copy), as two
#: buffers above it.
_JOIN_BELOW: Final = 16 * 1024
_HEAD_TIMEOUT_RESPONSE: Final = _closing_answer(408, "request head not received in time")
_TOO_MANY_CONNECTIONS_RESPONSE: Final = _closing_answer(
    503,
    "too many connections are open; retry on a connection you keep open (keep-alive)",
    "Retry-After: 1",
)
#: Descriptors kept free below the process's limit for everything but client connections: the
#: health port's connections, the handler processes' sockets and pidfds, metrics files; and
#: one more for each place a body may hold at once (its buffer or spool file), but never more
#: than half the limit (an async worker at --concurrency 1000 has a thousand places, which
#: would otherwise leave its thousand clients no room).
_RESERVED_FDS: Final = 64
_warned_at = 0.0


def _warn_too_many_connections(most: int) -> None:
    """Said once a minute at most: a flood of refusals is one line, not thousands."""
    global _warned_at
    now = time.monotonic()
    if now - _warned_at >= 60:
        _warned_at = now
        _log.warning(
            "the service port has %d connections open, as many as this process's open-files "
            "limit (ulimit -n) leaves room for; new ones get 503 until some close. Raise the "
            "limit, or put a balancer that reuses connections in front",
            most,
        )


def connection_cap(config: Config) -> int | None:
    """The most client connections the service port keeps open: what the open-files limit
    leaves after the front's own needs (``None``: no limit to keep below)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    places = config.workers * (config.concurrency + BODIES_AHEAD)
    return max(soft // 2, soft - _RESERVED_FDS - places)


class _Server(web.Server):
    def __init__(
        self,
        handler: Any,
        *,
        head_timeout: float,
        direct: DirectPath | None,
        max_connections: int | None,
        max_head_size: int,
        metrics: FrontMetrics,
        handler_cancellation: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            handler,
            request_factory=self._request,
            handler_cancellation=handler_cancellation,
            **kwargs,
        )
        #: What each connection is made with (``web.Server`` keeps them too, as private names):
        #: the loop, and the options that are the connections' (not the server's own).
        self._event_loop = asyncio.get_running_loop()
        self._connection_kwargs = kwargs
        self._head_timeout = head_timeout
        self._direct = direct
        self._max_connections = max_connections
        self._max_head_size = max_head_size
        self._metrics = metrics
        #: The parser's limits among the connections' options (aiohttp's defaults otherwise).
        self._parser_options: dict[str, Any] = {
            name: kwargs[name]
            for name in ("max_line_size", "max_headers", "max_field_size", "auto_decompress")
            if name in kwargs
        }

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: web.RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        """The request aiohttp's loop is to serve, made as aiohttp makes it, its connection told
        (:meth:`Connection.aiohttp_serves`)."""
        assert isinstance(protocol, Connection)
        protocol.aiohttp_serves()
        return web.BaseRequest(message, payload, protocol, writer, task, self._event_loop)

    def __call__(self) -> Connection:
        return Connection(
            self,
            loop=self._event_loop,
            head_timeout=self._head_timeout,
            direct=self._direct,
            parser_options=self._parser_options,
            max_connections=self._max_connections,
            max_head_size=self._max_head_size,
            metrics=self._metrics,
            **self._connection_kwargs,
        )


def make_web_server(
    handler: Any, config: Config, metrics: FrontMetrics, direct: DirectPath | None = None
) -> web.Server:
    """A low-level aiohttp server: no router or middleware on the hot path, JSON parse errors
    (counted in ``metrics``), the connection timeouts and head limit of ``config``, the direct
    path when given, no lingering read of a body nobody will use (the 413 path reads a bounded
    amount itself), a request whose client left cancelled (its call is withdrawn), as the
    direct path does, and bodies as sent: the service decodes a ``Content-Encoding`` itself
    (``content_encoding.py``)."""
    return _Server(
        handler,
        access_log=None,
        auto_decompress=False,
        keepalive_timeout=config.keepalive_timeout,
        head_timeout=config.request_head_timeout,
        max_head_size=config.max_head_size,
        metrics=metrics,
        direct=direct,
        # The service port only: the health port answers probes whatever clients hold open.
        max_connections=connection_cap(config) if direct is not None else None,
        lingering_time=0,
        handler_cancellation=True,
    )


def _too_slow(watched: _Watch, now: float, head_timeout: float) -> HttpError | None:
    """Why a body that holds a place is to be cut for its rate now (``None``: it is not)."""
    received = watched.received
    watched_for = now - watched.began
    if received is None or watched_for < _RATE_JUDGED_AFTER:
        return None
    got = received()
    rate = (got - watched.at_start) / watched_for
    if watched.expected is not None and watched.deadline is not None and rate > 0:
        remaining = watched.expected - got
        left = watched.deadline - now
        if left > _RATE_JUDGED_AFTER and remaining > 2 * rate * left:  # (else: the deadline)
            return BodyCannotArriveInTime(rate, remaining, left)
    if watched_for >= head_timeout and rate < MIN_BODY_RATE:
        return BodyTooSlow(rate, MIN_BODY_RATE)
    return None
