"""The limits on a request head, and the JSON answers to the heads refused.

* A head may take at most ``max_head_size`` bytes, counted as they arrive once the connection
  awaits a request (aiohttp's own limits would let each connection hold 1 MiB): else ``431``, and
  the connection closed. A head pipelined behind a request being served has aiohttp's limits.
* A head must arrive whole within ``head_timeout`` of its first byte (or of the connection, for
  the first request): a client trickling it (slowloris) is answered ``408`` and cut off.
* Malformed HTTP is answered ``400`` in JSON, counted, with one warning line instead of
  aiohttp's error record and traceback.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from typing import Any, Final

from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse
from aiohttp.web_server import Server

from abeja_runtime.encode import status_body, status_reply
from abeja_runtime.errors import HeadTooLarge
from abeja_runtime.front.aiohttp_private import HandlerInternals
from abeja_runtime.metrics import FrontMetrics

__all__ = ["HeadLimits", "closing_answer"]

_log = logging.getLogger("abeja_runtime")

#: What a client whose head was refused may still send before its connection is closed.
_REFUSED_HEAD_READ: Final = 1024 * 1024
_REFUSED_HEAD_WAIT: Final = 1.0
#: The first byte that is not of the empty lines the parser skips before a request line.
_NOT_EMPTY_LINE: Final = re.compile(rb"[^\r\n]")
#: The most of a parse error's reason that its warning line says.
_REASON_LOGGED: Final = 200


def closing_answer(status: int, message: str, *extra_headers: str) -> bytes:
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


_HEAD_TIMEOUT_RESPONSE: Final = closing_answer(408, "request head not received in time")


class HeadLimits(HandlerInternals):
    """A connection that limits its request heads (see the module). Its ``data_received`` counts
    a head's bytes against ``_head_room`` and arms the head timer while a head arrives."""

    def __init__(
        self,
        manager: Server,
        *,
        head_timeout: float,
        max_head_size: int,
        metrics: FrontMetrics,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._metrics = metrics
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        #: Some of a head has arrived.
        self._head_started = False
        self._max_head_size = max_head_size
        #: Bytes the head being received may still take; never below 0 (a read longer than
        #: the room is parsed only as far as the room goes).
        self._head_room = max_head_size

    def _busy(self) -> bool:
        """A request of this connection is being served or waits to be: no head is awaited."""
        raise NotImplementedError

    def _ends_head(self, data: bytes) -> bool:
        """Whether the head being received surely ends within its room in ``data``: an empty line
        there, after the empty lines llhttp skips before a request line."""
        room = self._head_room
        begun = _NOT_EMPTY_LINE.search(data, 0, room)
        return begun is not None and data.find(b"\r\n\r\n", begun.start(), room) >= 0

    def _refuse_head(self) -> None:
        """Answer ``431``; :class:`_RefusedHead` takes the transport until it closes."""
        transport = self.transport
        assert transport is not None  # open: it awaited a head
        self._disarm_head_timer()
        self._metrics.rejected_head("too_large")
        peer = transport.get_extra_info("peername")
        _log.warning(
            "a request head from %s went past %d bytes; answered 431 (the limit is "
            "ABEJA_RUNTIME_MAX_HEAD_SIZE, --max-head-size)",
            peer[0] if isinstance(peer, tuple) else peer,
            self._max_head_size,
        )
        refusal = HeadTooLarge(self._max_head_size)
        transport.write(closing_answer(refusal.status, refusal.message))
        transport.set_protocol(_RefusedHead(self, transport))
        self.transport = None  # aiohttp's request loop ends, and writes nothing more
        self.force_close()

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
        transport = self.transport
        if transport is None or self._busy():
            return
        if self._head_started:  # a partial request: it can still be told why
            transport.write(_HEAD_TIMEOUT_RESPONSE)
            self._metrics.rejected_head("timeout")
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> StreamResponse:
        """The answer to a request aiohttp's parser could not read (``400``: one warning line,
        counted) or whose service failed (aiohttp logs it, with its traceback)."""
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
        error = Response(status=reply.status, body=reply.body, headers=reply.headers)
        error.force_close()
        return error

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


class _RefusedHead(asyncio.Protocol):
    """A connection whose head was refused, until its close: what the client still sends is
    dropped, at most :data:`_REFUSED_HEAD_READ` bytes for :data:`_REFUSED_HEAD_WAIT` seconds, so
    that it reads its answer rather than a reset (of a socket closed with bytes unread)."""

    def __init__(self, connection: HeadLimits, transport: asyncio.Transport) -> None:
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
