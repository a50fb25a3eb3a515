"""The direct path: the requests served from callbacks, without aiohttp's request handling.

Nearly every model call is one HTTP/1.1 request whose body arrives with its head.
:class:`DirectRequests` takes such a request from the connection as soon as aiohttp's parser has
it (``connection.py``), begins its call and submits it, or refuses it at the door when the pool
would refuse it at once. A body above the inline limit with a ``Content-Length``, up to the spool
threshold, is read into shared memory first (``direct_body.py``). :class:`DirectResponder`
writes a whole answer from the answer's callback (no request or response object, no task), a
streamed or file-written one from a task (``answers.py``); an answer its handler process writes
to the client itself (``worker/client_streams.py``) is only counted, the connection lent with
the call. Every other request is left to aiohttp's path (``server.py``): see
:meth:`DirectRequests.accepts`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

from abeja_runtime.encode import error_reply
from abeja_runtime.errors import HttpError, ServiceBusy, Unauthorized
from abeja_runtime.frames import INLINE_LIMIT, Answer, Call, RpcAnswer, Written
from abeja_runtime.front.aiohttp_private import whole_body
from abeja_runtime.front.answers import ConnectionSink, send_whole, write_stream
from abeja_runtime.front.async_jobs import ASYNC_ID_HEADER
from abeja_runtime.front.body import IN_FRAME, Body
from abeja_runtime.front.call import FrontCall, Stage
from abeja_runtime.front.connection import Connection
from abeja_runtime.front.direct_body import DirectBody
from abeja_runtime.front.pending import STREAM_LOST, StreamFailed
from abeja_runtime.front.service import CallHead
from abeja_runtime.limits import ALLOWED_METHODS
from abeja_runtime.logs import (
    REQUEST_ID_HEADER,
    REQUESTER_ID_HEADER,
    request_id_from,
    requester_id_from,
)
from abeja_runtime.stream_limits import StreamEnd, StreamIdle, StreamTooLong

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.service import CallService

__all__ = ["DirectRequests", "DirectResponder"]

_log = logging.getLogger("abeja_runtime")


class DirectRequests:
    """The service port's direct path (see the module's docstring)."""

    def __init__(
        self,
        service: CallService,
        own_path: Callable[[str], bool],
        max_body_size: int,
        spool_threshold: int,
    ) -> None:
        self._service = service
        #: The paths the front answers itself (left to aiohttp's path).
        self._own_path = own_path
        limits = [INLINE_LIMIT, spool_threshold] + ([max_body_size] if max_body_size else [])
        #: The largest body taken whole here: it travels inside the call frame, as service()
        #: sends it.
        self._largest_body = min(limits)
        #: The largest body captured here (read into a shared buffer): one the front would
        #: neither spool nor refuse.
        self._largest_captured = min(limits[1:])

    def accepts(
        self, connection: Connection, message: RawRequestMessage, payload: StreamReader
    ) -> int | None:
        """``None``: the request is left to aiohttp's path (HTTP/1.0, an upgrade, a method the
        runtime refuses, the front's own paths, an async request, a compressed or refused body,
        while the pool takes no call); else the size of its body to read into a shared buffer
        (``0``: the body is whole already, and travels in the frame)."""
        if not (
            message.version == HttpVersion11
            and message.method in ALLOWED_METHODS
            and not message.upgrade
            and self._service.admitting
            and not self._own_path(message.url.path)
            and ASYNC_ID_HEADER not in message.headers
            and "Content-Encoding" not in message.headers  # decoded on aiohttp's path
        ):
            return None
        if self._service.keys is not None:
            try:
                self._service.keys.caller(message.headers)
            except Unauthorized:
                return None  # refused on aiohttp's path, which reads or drops its body
        if payload is EMPTY_PAYLOAD or (
            payload.is_eof()
            and payload.exception() is None
            and payload.total_bytes <= self._largest_body
        ):
            return 0
        return self._captured_size(connection, message, payload) or None

    def _captured_size(
        self, connection: Connection, message: RawRequestMessage, payload: StreamReader
    ) -> int:
        """The size of a body above the inline limit to read into a shared buffer (0: left to
        aiohttp's path: chunked, above the spool threshold, awaiting ``100 Continue``, one the
        queue could not take)."""
        if payload.exception() is not None or message.method == "GET":
            return 0
        headers = message.headers
        if message.chunked or "Expect" in headers:
            return 0
        size = int(headers.get("Content-Length", "0"))  # digits only: aiohttp checked it
        if not INLINE_LIMIT < size <= self._largest_captured:
            return 0
        if not self._service.bodies.may_read():  # else aiohttp's path answers 503
            return 0
        if not payload.is_eof() and not connection.can_capture():
            return 0
        return size

    def take(
        self,
        connection: Connection,
        message: RawRequestMessage,
        payload: StreamReader,
        captured: int,
    ) -> DirectResponder | None:
        """Begin the request's call, its answer written by the responder returned; or refuse
        it at once, at the door (``None``; see :meth:`CallService.turned_away`)."""
        headers = message.headers
        service = self._service
        method = message.method
        url = message.url
        request_id = request_id_from(headers.get(REQUEST_ID_HEADER))
        requester_id = requester_id_from(headers.get(REQUESTER_ID_HEADER))
        head = CallHead(method, url.path, time.time(), request_id, requester_id, headers)
        # (A key given: accepts() saw it.)
        caller = None if service.keys is None else service.keys.caller(headers)
        if not captured and (refused := service.turned_away(head, caller)) is not None:
            _turn_away(connection, refused, close=message.should_close or service.draining)
            return None
        responder = DirectResponder(
            service, connection, keep_alive=not message.should_close, lends=method != "HEAD"
        )
        call = responder.call = service.begin(head, responder)
        if caller is not None:
            call.entry.note("caller", caller)
        if captured:  # read into a shared buffer first (DirectBody)
            body: bytes | None = None
            size = captured
        else:
            body = b"" if payload is EMPTY_PAYLOAD or method == "GET" else whole_body(payload)
            size = len(body)
        frame = call.frame(method, url, message.raw_headers, body, size)
        if body is None:
            responder.read_body(frame, payload)
        else:
            call.submit(frame, IN_FRAME, responder)
        return responder


def _turn_away(connection: Connection, entry: CallEntry, *, close: bool) -> None:
    """Answer a request refused at the door ``503``, and end its entry and the connection's
    turn (whatever the writing raised)."""
    reply = error_reply(ServiceBusy())
    assert isinstance(reply.body, bytes)
    sent = False
    try:
        send_whole(connection, entry, reply.status, reply.headers, reply.body, close=close)
        sent = True
    finally:
        entry.end()
        connection.direct_done(close=close or not sent)


class DirectResponder:
    """Writes a direct call's answers on its connection (the call's
    :class:`~abeja_runtime.front.call.Responder`), and tells the call when the connection is
    lost: a whole answer in one :meth:`~abeja_runtime.front.connection.Connection.send_direct`
    from the answer's callback; a streamed one, or one written from its file, from a task."""

    __slots__ = (
        "_body", "_connection", "_keep_alive", "_lends", "_lent_closes", "_lent_writing",
        "_service", "_writing", "call",
    )  # fmt: skip

    def __init__(
        self, service: CallService, connection: Connection, *, keep_alive: bool, lends: bool
    ) -> None:
        self._service = service
        self._connection = connection
        self._keep_alive = keep_alive
        self.call: FrontCall
        self._body: DirectBody | None = None
        #: The task writing a streamed or file-written answer.
        self._writing: asyncio.Task[None] | None = None
        #: Its answer is a stream its process writes (:meth:`_lent_stream`).
        self._lent_writing = False
        #: The connection may be lent to the call's process (``pending.ClientLender``), and
        #: whether the head its process writes ends it (said when it was lent).
        self._lends = lends
        self._lent_closes = False

    def lend(self) -> tuple[int, bool] | None:
        """The connection's descriptor, and whether the answer ends it, to lend with the call:
        while it is open and has nothing left to write (the process's bytes must come after
        everything before them), once the pool lends at all."""
        transport = self._connection.transport
        if not (self._lends and self._service.pool.lends_connections):
            return None
        if transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return None
        self._lent_closes = self._closes()
        return int(transport.get_extra_info("socket").fileno()), self._lent_closes

    def read_body(self, frame: Call, payload: StreamReader) -> None:
        """Read the body that is not in the frame; the call is submitted once it is whole."""
        self._body = DirectBody(
            self._service,
            self._connection,
            payload,
            frame.body_size,
            self.call,
            lambda body: self._body_read(frame, body),
            self._body_failed,
        )
        self._body.start()

    def _body_read(self, frame: Call, body: Body) -> None:
        """The body is whole: the call is submitted. (Its reader, which holds this responder,
        is let go: it would otherwise leave the call's objects to the collector.)"""
        self._body = None
        self.call.submit(frame, body, self)

    def _body_failed(self, exc: HttpError) -> None:
        """The body was not read whole: the answer ends the connection."""
        self._keep_alive = False
        self._body = None
        self.call.refuse(exc)

    def answer(self, call: FrontCall, answer: Answer | RpcAnswer) -> None:
        assert isinstance(answer, Answer)
        if answer.body is not None:
            self._write(answer.status, answer.headers, answer.body)
            return
        if answer.written:
            self._lent_stream(answer)
            return
        self._writing = asyncio.create_task(self._stream(answer))
        self._writing.add_done_callback(self._written)

    def refuse(self, call: FrontCall, exc: HttpError) -> None:
        ticket = call.ticket
        if ticket is not None and ticket.lent:  # its process may be writing: when it is done
            ticket.on_returned = lambda: self._refuse_returned(call, exc)
            return
        reply = error_reply(exc)
        assert isinstance(reply.body, bytes)
        self._write(reply.status, reply.headers, reply.body)

    def _closes(self) -> bool:
        return not self._keep_alive or self._service.draining

    def _write(self, status: int, headers: tuple[tuple[str, str], ...], body: bytes) -> None:
        call = self.call
        close = self._closes()
        sent = False
        try:
            send_whole(self._connection, call.entry, status, headers, body, close=close)
            sent = True
        finally:  # whatever failed above, the call ends (and a connection left unanswered)
            call.finish()
            self._connection.direct_done(close=close or not sent)

    async def _stream(self, answer: Answer) -> None:
        close = self._closes()
        sink = ConnectionSink(self._connection, self._service.loop, close=close)
        whole = await write_stream(sink, self.call, answer.status, answer.headers)
        self._connection.direct_done(close=close or not whole)  # the call ends in _written

    def _refuse_returned(self, call: FrontCall, exc: HttpError) -> None:
        """The refusal of a call whose connection was lent, now that its process is done: sent,
        unless the process began its streamed answer before it learnt (then cut short)."""
        if call.stage is Stage.DONE:  # its client left meanwhile
            return
        ticket = call.ticket
        if ticket is None or not ticket.written:
            self.refuse(call, exc)
            return
        call.entry.count(exc.status)
        call.finish()
        self._connection.direct_done(close=True)

    def _lent_stream(self, answer: Answer) -> None:
        """A streamed answer that its process writes to the client itself: counted as it says
        when its ``End`` comes (:meth:`_lent_ended`), from the frame's own callback."""
        ticket = self.call.ticket
        assert ticket is not None
        self.call.entry.streaming(answer.status, chunked=True)
        self._lent_writing = True
        ticket.when_ended(self._lent_ended)

    def _lent_ended(self, end: object) -> None:
        """The stream its process wrote is over (its ``End``, or the process's exit): counted,
        the connection the front's again, the call finished."""
        call = self.call
        ticket, entry = call.ticket, call.entry
        assert ticket is not None
        try:
            report = ticket.report
            if report is None:  # its process exited, or the call was settled, without its End
                lost = StreamEnd.WORKER_LOST if end is STREAM_LOST else StreamEnd.FAILED
                report = Written(lost, 0, 0, 0.0, ())
            entry.written(report)
            if report.end is StreamEnd.CLIENT_LEFT:
                call.client_left()
            elif report.end is not StreamEnd.COMPLETE:
                call.cut(self._cut_by(report.end))
            close = self._lent_closes or report.end is not StreamEnd.COMPLETE
            self._connection.direct_done(close=close)
        except Exception:  # a defect: logged, and the connection ended
            _log.exception("ending a stream its process wrote failed")
            call.client_left()
            self._connection.direct_done(close=True)
        finally:
            call.finish()

    def _cut_by(self, end: StreamEnd) -> Exception:
        """What cut short a stream its process wrote."""
        if end is StreamEnd.IDLE:
            return StreamIdle(self._service.stream_idle or 0)
        if end is StreamEnd.TOO_LONG:
            return StreamTooLong(self._service.stream_timeout or 0)
        return StreamFailed(lost=end is StreamEnd.WORKER_LOST)

    def _written(self, task: asyncio.Task[None]) -> None:
        """However the writing task ended (also cancelled before its first step): the call
        finishes, a cancelled one as its client's leaving. A task that failed otherwise (a
        defect) is logged, and its connection ended: it never reached its ``direct_done``."""
        if task.cancelled():
            self.call.client_left()
        elif task.exception() is not None:
            _log.error("writing the answer failed", exc_info=task.exception())
            self.call.client_left()
            self._connection.direct_done(close=True)
        self.call.finish()

    def client_gone(self) -> None:
        """The connection was lost before the answer was out: nobody waits for it."""
        if self._writing is not None or self._lent_writing:
            ticket = self.call.ticket
            if ticket is not None and ticket.written:
                # Its process writes it: it stops, and its End says how far the client got
                # (all of it, when the client left once it had the body's end).
                if ticket.lent:
                    self._service.pool.stop_stream(ticket)
                return
            assert self._writing is not None
            self._writing.cancel()  # it ends the call
            return
        if self._body is not None:  # not submitted yet
            self._body.abandon()
        self.call.client_left()
