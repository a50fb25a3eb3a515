"""The front's HTTP connection: aiohttp's connection handler, with the direct path beside aiohttp's
own request handling.

A request the :class:`DirectPath` takes (``direct.py``) is handed to it as soon as aiohttp's parser
has it, and answered from a callback (:meth:`Connection.send_direct`, :meth:`Connection.
direct_done`). The others (and a parse error) go through aiohttp's request handling, in order:
the direct path only takes a request while aiohttp waits for one (or before its loop has begun),
and wakes it for the first one it leaves. After a direct answer the keep-alive period is the
connection's own timer. :class:`PublicConnection` serves without the direct path.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Protocol

from aiohttp.http import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

from abeja_runtime.front.capture import CapturingConnection
from abeja_runtime.front.request_heads import HeadLimits

__all__ = ["Connection", "DirectCall", "DirectPath", "PublicConnection"]

#: A direct answer's head and body go out in one write below this size (one copy), as two
#: buffers above it.
_JOIN_BELOW: Final = 16 * 1024
#: aiohttp's parse of the bytes received, which no class between it and the connection
#: overrides: called directly on the hot path (``super()`` would walk them all each time).
_aiohttp_receives: Final = RequestHandler.data_received


class DirectCall(Protocol):
    """A request the direct path is serving on a connection."""

    def client_gone(self) -> None:
        """The connection was lost before the answer was written."""


class DirectPath(Protocol):
    """Serves the simple requests of a connection (``direct.DirectRequests``)."""

    def accepts(
        self, connection: Connection, message: RawRequestMessage, payload: StreamReader
    ) -> int | None:
        """``None``: the request is not taken; else :meth:`take`'s ``captured``."""

    def take(
        self,
        connection: Connection,
        message: RawRequestMessage,
        payload: StreamReader,
        captured: int,
    ) -> DirectCall | None:
        """Serve the request (``None``: answered at once, no call begun); its answer is
        written with :meth:`Connection.send_direct`, and :meth:`Connection.direct_done` ends
        it."""


class _Taking:
    """The direct call of a connection while the direct path takes its request."""

    def client_gone(self) -> None:
        pass


_TAKING: Final = _Taking()


class Connection(HeadLimits, CapturingConnection):
    """One client connection of the service port (or of the health port, without a direct
    path)."""

    def __init__(self, manager: Server, *, direct: DirectPath | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._direct = direct
        self._direct_call: DirectCall | None = None
        #: aiohttp's request loop (start) has begun.
        self._aiohttp_started = False
        #: aiohttp's request loop serves a request: from taking it (aiohttp_serves) to its
        #: answer (log_access).
        self._aiohttp_serving = False
        #: aiohttp answered a request since the direct path last took one: its keep-alive timer
        #: runs, and is stopped when the direct path takes the next request.
        self._aiohttp_answered = False
        #: The keep-alive timer after a direct answer, and the end of the idle period it keeps.
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_until = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.transport is None:  # refused by the server (web_server.connection_cap)
            return
        # aiohttp's keep-alive timer would close the connection while the direct path serves
        # it: a silent connection is closed by the head timer instead.
        self.keep_alive(True)
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
        if (
            len(data) > self._head_room
            and self.transport is not None
            and not self._busy()
            and not self._ends_head(data)
        ):  # rare: a head past its limit, or one whose end is in a later read
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
                _aiohttp_receives(self, data)
            finally:
                self.aio_waiter = waiter
            taken = self._take_requests()
        else:
            _aiohttp_receives(self, data)
            taken = False
        if taken or self._busy():
            self._disarm_head_timer()  # a whole head arrived
        elif data and self.transport is not None:  # a part of a head
            self._head_room -= len(data)
            self._head_started = True
            self._arm_head_timer()

    def _busy(self) -> bool:
        return bool(self.aio_messages) or self._aiohttp_serving or self._direct_call is not None

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

    def aiohttp_serves(self) -> None:
        """aiohttp's request loop took a request off the queue (its handler begins later, and
        its body may still be arriving)."""
        self._aiohttp_serving = True

    def log_access(
        self, request: BaseRequest, response: StreamResponse, time: float | None
    ) -> None:
        """aiohttp calls this once a request it served is answered (its answer written whole,
        or its client gone); it arms its keep-alive timer next."""
        self._aiohttp_serving = False
        self._aiohttp_answered = True
        super().log_access(request, response, time)

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
        while self._direct_call is None and self.transport is not None:
            if not messages:
                if self.aio_buffer_paused and self._parse_held_back():
                    continue
                break
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
            if self._aiohttp_answered:  # its keep-alive timer would close the connection
                self._aiohttp_answered = False
                self.keep_alive(True)
            # Busy while it is taken: reading its body may resume the transport's reading,
            # which parses (and would take) the requests behind it.
            self._direct_call = _TAKING
            call = direct.take(self, message, payload, captured)
            if self._direct_call is _TAKING:  # else answered at once (direct_done)
                self._direct_call = call
            if self.aio_buffer_paused and self._direct_call is not None:
                self.release_queue_hold()
        return taken

    def _parse_held_back(self) -> bool:
        """Whether requests the parser held back while reading was held for a full queue are
        queued now. The connection is busy meanwhile: the parse takes none."""
        self._direct_call = _TAKING
        try:
            self.release_queue_hold()
        finally:
            if self._direct_call is _TAKING:
                self._direct_call = None
        return bool(self.aio_messages)

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
        if self.transport is None:
            return
        # The keep-alive period: the connection is closed then if it is idle.
        self._idle_until = self.event_loop.time() + self._keepalive_seconds
        if self._idle_timer is None:
            self._idle_timer = self.event_loop.call_at(self._idle_until, self._idle_ends)
        if not taking:
            self._take_requests()

    def _idle_ends(self) -> None:
        self._idle_timer = None
        if self._idle_until > self.event_loop.time():  # a later answer moved it
            self._idle_timer = self.event_loop.call_at(self._idle_until, self._idle_ends)
        elif not self._busy():  # (else its answer, or aiohttp's, starts the period again)
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        call, self._direct_call = self._direct_call, None
        if call is not None:
            call.client_gone()
        super().connection_lost(exc)


class PublicConnection(Connection):
    """A connection that reaches none of aiohttp's private names, for an installed aiohttp that
    lacks one: every request goes through aiohttp's request handling, with aiohttp's keep-alive
    timer and its own limits on heads (8190 bytes a line, 128 lines); bodies are watched and
    malformed requests answered in JSON as on any connection. Made with no direct path."""

    log_access = RequestHandler.log_access  # (a coroutine function on aiohttp's main branch)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        RequestHandler.connection_made(self, transport)  # no head timer, aiohttp's own

    def data_received(self, data: bytes) -> None:
        self._last_data = self.event_loop.time()
        _aiohttp_receives(self, data)
