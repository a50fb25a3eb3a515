"""A request body being read: watched (:meth:`CapturingConnection.watch_body`), and read straight
from the socket into its shared buffer, past aiohttp's parser (:meth:`~CapturingConnection.
capture_body`).

A body that stalls, or arrives too slowly to hold one of the front's places for bodies, is ended
with ``408``. While a :class:`BodyCapture` is the connection's protocol, the event loop reads the
socket into the buffer itself (``asyncio.BufferedProtocol``): the kernel's copy is the only one,
where aiohttp's parser would copy each byte three times more. The capture reads exactly the
body's declared length, then gives the transport back to the connection, which starts a fresh
parser for the requests behind it (llhttp cannot be told to skip a body it did not see). A client
that leaves mid-body reaches the connection as always (``connection_lost``), and so does what the
front writes meanwhile (flow control).
"""

from __future__ import annotations

import asyncio
import mmap
from collections.abc import Callable, Iterator
from typing import Any, Final, NamedTuple

from aiohttp.streams import StreamReader
from aiohttp.web_server import Server

from abeja_runtime.errors import BodyCannotArriveInTime, BodyTimeout, BodyTooSlow, HttpError
from abeja_runtime.front.aiohttp_private import HandlerInternals

__all__ = ["BodyCapture", "CapturingConnection"]

#: Bytes a second a body must average while it holds one of the front's places for bodies (from
#: the stall timeout after it took the place on): far below any real network.
MIN_BODY_RATE: Final = 1024
#: A body that holds a place is judged by its rate from this many seconds on, at most every as
#: many: one that could not be whole by its deadline at twice its rate is cut then.
_RATE_JUDGED_AFTER: Final = 1.0
#: Where the rest of a connection's bytes go after a capture was given up (never into a buffer
#: that may already hold another request's body). Anonymous memory: resident only once used.
_DISCARDED: Final = memoryview(mmap.mmap(-1, 64 * 1024))


class _Watch(NamedTuple):
    """A body being read (see :meth:`CapturingConnection.watch_body`); ``began``,
    ``at_start``: when the watch began (loop time), and the bytes received then."""

    arriving: Callable[[], bool]
    stalled: Callable[[BaseException], None]
    received: Callable[[], int] | None
    expected: int | None
    deadline: float | None
    began: float
    at_start: int


class CapturingConnection(HandlerInternals):
    """A connection that watches the body being read on it, and can read the current request's
    body into a buffer itself (:meth:`capture_body`), or leave it unread in the socket meanwhile
    (:meth:`hold_body`). Its ``data_received`` (and a capture's progress) sets ``_last_data``,
    the loop time bytes last arrived."""

    def __init__(self, manager: Server, *, stall_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._stall_timeout = stall_timeout
        self._last_data = 0.0
        self._body_timer: asyncio.TimerHandle | None = None
        self._watched: _Watch | None = None
        self._reading_off = False  # paused by flow control (pause_reading until resume_reading)

    @property
    def fresh(self) -> bool:
        """Accepted, and not a byte received yet: a request is on its way."""
        return self._last_data == 0.0

    def body_progress(self) -> None:
        """Bytes of a body read past the parser arrived."""
        self._last_data = self.event_loop.time()

    def watch_body(
        self,
        arriving: Callable[[], bool],
        stalled: Callable[[BaseException], None],
        received: Callable[[], int] | None = None,
        expected: int | None = None,
        time_left: float | None = None,
    ) -> None:
        """Call ``stalled`` with :class:`~abeja_runtime.errors.BodyTimeout` if no byte of the
        body arrives for the stall timeout while it is ``arriving()``; and, for a body that
        holds a place (``received()``: its bytes so far), from :data:`_RATE_JUDGED_AFTER`
        seconds on, with :class:`~abeja_runtime.errors.BodyCannotArriveInTime` when its
        ``expected`` length could not be whole within ``time_left`` (its deadline) even at
        twice its average rate, and with :class:`~abeja_runtime.errors.BodyTooSlow` when, the
        stall timeout or more after the watch began, it has arrived slower than
        :data:`MIN_BODY_RATE` on average. One timer per connection, not reset for every packet:
        it looks at when bytes last came, and at the body watched now."""
        now = self.event_loop.time()
        self._last_data = now
        deadline = None if time_left is None else now + time_left
        at_start = received() if received else 0
        self._watched = _Watch(arriving, stalled, received, expected, deadline, now, at_start)
        if self._body_timer is None:
            first = self._stall_timeout
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
        stall_timeout = self._stall_timeout
        late = (
            BodyTimeout(stall_timeout)
            if idle >= stall_timeout
            else _too_slow(watched, now, stall_timeout)
        )
        if late is not None:
            self._watched = None
            watched.stalled(late)
            return
        next_look = max(0.0, stall_timeout - (now - watched.began)) or 1.0
        if watched.expected is not None and watched.deadline is not None:
            next_look = _RATE_JUDGED_AFTER
        self._body_timer = self.event_loop.call_later(
            min(stall_timeout - idle, next_look), self._check_body
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._watched = None
        super().connection_lost(exc)

    def pause_reading(self) -> None:
        self._reading_off = True
        super().pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        """aiohttp calls this each time a body is read below its low-water mark, and it then
        parses the buffer again (one more ``data_received``) even when reading was never
        paused: only a paused connection has anything to resume."""
        if self._reading_off:
            self._reading_off = False
            super().resume_reading(resume_parser)

    def can_capture(self) -> bool:
        """Whether a body still arriving can be captured: the connection is open and not held
        for a full message queue (a paused payload buffer is resumed by the capture itself)."""
        transport = self.transport
        return transport is not None and not transport.is_closing() and not self.aio_buffer_paused

    def capture_body(
        self, payload: StreamReader, into: mmap.mmap, size: int, done: Callable[[], None]
    ) -> BodyCapture | None:
        """Read the current request's ``size``-byte body into ``into``: what the parser has of
        it now, then the rest straight from the socket (a :class:`BodyCapture`), then
        ``done()``. ``None`` when the body was whole already (``done`` is not called).

        Only for a request taken when :meth:`can_capture` said so.
        """
        offset = 0
        for chunk in self._parsed_body(payload):
            into[offset : offset + len(chunk)] = chunk
            offset += len(chunk)
        if payload.is_eof():
            return None
        # Every byte received so far is parsed (reading is on): the rest is to come.
        assert self.transport is not None and not self._reading_off
        capture = BodyCapture(self, memoryview(into)[offset:size], done)
        self.transport.set_protocol(capture)
        return capture

    def hold_body(self, payload: StreamReader) -> None:
        """Read no more of the current request's body until it is captured: a body waiting
        for a place stays in the socket (and the client), not in the front's memory, and
        it is then read straight into its buffer rather than through the parser."""
        if not payload.is_eof() and not self._reading_off:
            self.pause_reading()

    def _parsed_body(self, payload: StreamReader) -> Iterator[bytes]:
        """What the parser has of the current request's body, piece by piece, until every
        byte received is taken and reading is on again (a paused parser keeps what came after
        a full payload buffer in its own tail, and parses it when reading resumes)."""
        while True:
            while chunk := payload.read_nowait(-1):
                yield chunk
            if payload.is_eof() or not self._reading_off:
                return
            self.resume_reading()

    def body_captured(self) -> None:
        """The captured body is whole: the connection reads again, with a fresh parser (the
        old one is still waiting for the body's bytes)."""
        assert self.transport is not None
        self.transport.set_protocol(self)
        self.replace_parser()


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


def _too_slow(watched: _Watch, now: float, stall_timeout: float) -> HttpError | None:
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
    if watched_for >= stall_timeout and rate < MIN_BODY_RATE:
        return BodyTooSlow(rate, MIN_BODY_RATE)
    return None
