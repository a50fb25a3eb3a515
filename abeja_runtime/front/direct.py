"""The direct path: the requests served from callbacks, without aiohttp's request handling.

Nearly every model call is one HTTP/1.1 request whose body (JSON, a small image) arrives with
its head. :class:`DirectRequests` takes such a request from the connection as soon as aiohttp's
parser has it (``connection.py``), submits its call to the pool, and writes the answer from the
answer's callback: no aiohttp request or response object, no task, no coroutine. A body above
the inline limit with a ``Content-Length``, up to the spool threshold, is taken too: its call
reads it into a buffer of shared memory first (``direct_body.py``), straight from the socket
(``capture.py``). It does what :meth:`HttpServer.service
<abeja_runtime.front.server.HttpServer.service>` does for the same request, through the same
:class:`~abeja_runtime.front.calls.CallService` (call frame, deadline, refusals, access record,
metrics), and writes its answer by the same rules (``answers.py``: the head, a bad header's
``500``, a streamed or file-written answer's loop); what is its own is the transport: a whole
answer in one :meth:`~abeja_runtime.front.connection.Connection.send_direct` from the answer's
callback, a streamed one from a task through aiohttp's ``StreamWriter``. It leaves every other
request to aiohttp's path: a chunked or compressed body, one above the spool threshold or
awaiting ``100 Continue``, HTTP/1.0, an upgrade, a method the runtime refuses, the health check
and the style's own front paths, an async (ARMS) request, a body the queue could not take, and
any request while the pool takes no call (no worker is ready, or the workers are stopping).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader

from abeja_runtime.errors import HttpError, ServiceBusy
from abeja_runtime.frames import INLINE_LIMIT, Answer, Call, RpcAnswer
from abeja_runtime.front.accounting import CallEntry
from abeja_runtime.front.aiohttp_private import whole_body
from abeja_runtime.front.answers import ConnectionSink, send_whole, write_stream
from abeja_runtime.front.arms import ASYNC_ID_HEADER
from abeja_runtime.front.connection import Connection
from abeja_runtime.front.direct_body import DirectBody
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.limits import ALLOWED_METHODS
from abeja_runtime.logs import (
    REQUEST_ID_HEADER,
    REQUESTER_ID_HEADER,
    request_id_from,
    requester_id_from,
)
from abeja_runtime.tracing import carrier

if TYPE_CHECKING:
    from abeja_runtime.front.calls import CallService

__all__ = ["DirectRequests"]

_log = logging.getLogger("abeja_runtime")


class DirectRequests:
    """The service port's direct path (see the module's docstring)."""

    def __init__(
        self,
        calls: CallService,
        own_path: Callable[[str], bool],
        max_body_size: int,
        spool_threshold: int,
    ) -> None:
        self._calls = calls
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
        """``None``: the request is left to aiohttp's path; else the size of its body to read
        into a shared buffer (``0``: the body is whole already, and travels in the frame)."""
        if not (
            message.version == HttpVersion11
            and message.method in ALLOWED_METHODS
            and not message.upgrade
            and self._calls.admitting
            and not self._own_path(message.url.path)
            and ASYNC_ID_HEADER not in message.headers
            # A body with a Content-Encoding is decoded, and any wrong in it answered, on
            # aiohttp's path (server.py with content_encoding.py).
            and "Content-Encoding" not in message.headers
        ):
            return None
        if self._in_frame(payload):
            return 0
        return self._captured_size(connection, message, payload) or None

    def _in_frame(self, payload: StreamReader) -> bool:
        """Whether the body is whole already, and small enough for the call frame."""
        return payload is EMPTY_PAYLOAD or (
            payload.is_eof()
            and payload.exception() is None
            and payload.total_bytes <= self._largest_body
        )

    def _captured_size(
        self, connection: Connection, message: RawRequestMessage, payload: StreamReader
    ) -> int:
        """The size of a body above the inline limit that this path reads into a shared buffer
        itself (0 for one it leaves to aiohttp's path: chunked, compressed, above the spool
        threshold, awaiting ``100 Continue``, one the queue could not take)."""
        if payload.exception() is not None or message.method == "GET":
            return 0
        headers = message.headers
        if message.chunked or "Expect" in headers:
            return 0
        size = int(headers.get("Content-Length", "0"))  # digits only: aiohttp checked it
        if not INLINE_LIMIT < size <= self._largest_captured:
            return 0
        if not self._calls.may_read_body():  # else aiohttp's path answers 503
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
    ) -> _DirectCall:
        headers = message.headers
        calls = self._calls
        method = message.method
        url = message.url
        entry = calls.accounting.open(
            method,
            url.path,
            time.time(),
            request_id_from(headers.get(REQUEST_ID_HEADER)),
            requester_id_from(headers.get(REQUESTER_ID_HEADER)),
            headers,
        )
        if captured:  # read into a shared buffer by the call (DirectBody)
            body: bytes | None = None
            size = captured
        else:
            body = b"" if payload is EMPTY_PAYLOAD or method == "GET" else whole_body(payload)
            size = len(body)
        call = Call(
            calls.next_id(),
            method,
            url.raw_path,
            url.raw_query_string,
            message.raw_headers,
            entry.request_id,
            entry.requester_id,
            body,
            "",
            size,
            carrier(entry.trace),
        )
        direct = _DirectCall(
            calls,
            connection,
            call,
            entry,
            keep_alive=not message.should_close,
            payload=None if body is not None else payload,
        )
        if body is None:
            direct.read_body()  # then submit
        else:
            direct.submit()
        return direct


class _DirectCall:
    """One request on the direct path, from its call's submission until its answer is out."""

    __slots__ = (
        "_body",
        "_calls",
        "_connection",
        "_entry",
        "_keep_alive",
        "_over",
        "_streaming",
        "deadline",
        "pending",
    )

    def __init__(
        self,
        calls: CallService,
        connection: Connection,
        call: Call,
        entry: CallEntry,
        *,
        keep_alive: bool,
        payload: StreamReader | None,
    ) -> None:
        self._calls = calls
        self._connection = connection
        #: Its counts: ended (499 if never counted) however the call ends.
        self._entry = entry
        self._keep_alive = keep_alive
        #: The calls whose deadline is watched with this one's (server.submit).
        self.deadline: set[PendingCall] | None = None
        self._over = False
        self._streaming: asyncio.Task[None] | None = None
        if payload is None:  # the body is in the frame
            self._body: DirectBody | None = None
            self.pending = PendingCall(call, calls.loop, trace=entry.trace)
        else:
            self._body = DirectBody(
                calls,
                connection,
                payload,
                call.body_size,
                entry.received,
                self._body_ready,
                self._body_failed,
            )
            self.pending = PendingCall(call, calls.loop, None, self._body.release, entry.trace)

    def read_body(self) -> None:
        """Read the body that is not in the frame; the call is submitted once it is whole."""
        assert self._body is not None
        self._body.start()

    def _body_ready(self) -> None:
        assert self._body is not None
        self.pending.fd = self._body.fd
        self.submit()

    def _body_failed(self, exc: HttpError) -> None:
        """The body was not read whole (it stalled, or was still arriving at the deadline):
        the answer ends the connection."""
        self._keep_alive = False
        self.refused(exc)

    def submit(self) -> None:
        """Hand the call to the pool (answered at once when the pool is full)."""
        try:
            self.deadline = self._calls.submit(self.pending, self._entry.received)
        except ServiceBusy as exc:
            self.refused(exc)
            return
        self.pending.answer.add_done_callback(self.answered)

    def answered(self, future: asyncio.Future[Answer | RpcAnswer]) -> None:
        """The answer's callback: an answer, or the front's 504 / 502 for this call."""
        if self._over:  # the client left
            return
        if self.deadline is not None:
            self.deadline.discard(self.pending)
        exc = future.exception()
        if exc is not None:  # the front's own: 504 (deadline) or 502 (the worker died)
            assert isinstance(exc, HttpError), exc
            self.refused(exc)
            return
        answer = future.result()
        assert isinstance(answer, Answer)
        if answer.body is None:  # streamed, or written from its file (a big body)
            self._streaming = asyncio.create_task(self._stream(answer))
            self._streaming.add_done_callback(self._stream_over)
            return
        self._write(answer.status, answer.headers, answer.body)

    def refused(self, exc: HttpError) -> None:
        reply = self._calls.refusal(exc)
        assert isinstance(reply.body, bytes)
        self._write(reply.status, reply.headers, reply.body)

    def _write(self, status: int, headers: tuple[tuple[str, str], ...], body: bytes) -> None:
        self._over = True
        call = self.pending.frame
        assert isinstance(call, Call)
        close = not self._keep_alive or self._calls.draining
        sent = False
        try:
            send_whole(
                self._connection, self._entry, status, headers, call.request_id, body, close=close
            )
            sent = True
        finally:  # whatever failed above, the call ends (and a connection left unanswered)
            self._entry.end()
            self._connection.direct_done(close=close or not sent)

    async def _stream(self, answer: Answer) -> None:
        """A streamed answer, or a big one written from its file (``answers.py``'s
        :func:`~abeja_runtime.front.answers.write_stream`, over this connection)."""
        close = not self._keep_alive or self._calls.draining
        sink = ConnectionSink(self._connection, self._calls.loop, close=close)
        whole = await write_stream(
            sink, self._calls, self.pending, self._entry, answer.status, answer.headers
        )
        # The call ends in _stream_over, on every path.
        self._connection.direct_done(close=close or not whole)

    def _stream_over(self, task: asyncio.Task[None]) -> None:
        """However the writing task ended (also cancelled before its first step, when no code
        of it ran): the call is ended, its file closed, and a cancelled one abandoned (each
        once). The one place that ends a streamed or file-written answer's call. A task that
        failed otherwise (a defect) is logged, and its connection ended: it never reached its
        ``direct_done``."""
        if task.cancelled():
            self._calls.abandon(self.pending, self._entry)
        elif task.exception() is not None:
            _log.error("writing the answer failed", exc_info=task.exception())
            self._calls.abandon(self.pending, self._entry)
            self._connection.direct_done(close=True)
        if self.pending.answer_file is not None:
            self.pending.answer_file.close()
        self._over = True
        self._entry.end()

    def client_gone(self) -> None:
        """The connection was lost before the answer was out: nobody waits for it."""
        if self._streaming is not None:
            self._streaming.cancel()  # it ends itself
            return
        if self._over:
            return
        self._over = True
        if self.pending.answer_file is not None:  # answered, not written yet
            self.pending.answer_file.close()
        if self._body is not None and self._body.reading:  # not submitted yet
            self._body.abandon()
            self._entry.end()
            return
        if self.deadline is not None:
            self.deadline.discard(self.pending)
        self._calls.abandon(self.pending, self._entry)
        self._entry.end()
