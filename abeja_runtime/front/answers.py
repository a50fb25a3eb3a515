"""How the front writes an answer to a client, on both ways in (``server.py``, ``direct.py``).

An answer's head follows the same rules on every path: the handler's headers as it gave them,
then the request id (:data:`~abeja_runtime.logs.REQUEST_ID_HEADER`), the framing
(``Content-Length``, or ``Transfer-Encoding: chunked`` for a streamed answer; none for the
statuses without a body, 1xx, 204 and 304, as aiohttp sends them), ``Date``, ``Server``, and
``Connection: close`` when the connection ends with it. A head the client could misread (a
header holding a line break, which would split the answer, or another control character) is
not sent: the answer becomes the runtime's own ``500`` (:data:`~abeja_runtime.encode.
UNEXPECTED_ERROR`), and the log says why (:func:`unsendable`).

Three ways to write one:

* A whole answer on the direct path (:func:`send_whole`): its head built here (the checked part
  cached, :func:`checked_head`) and written with its body in one
  :meth:`~abeja_runtime.front.connection.Connection.send_direct`, from the answer's callback.
  It is the hot path (nearly every call): no await, no task, nothing made per request but
  the head's bytes.
* A whole answer on aiohttp's path (:func:`send_reply`, :func:`refuse`): an aiohttp
  ``web.Response``, checked by the same rules first; there the answer may come before the
  request's body was read, so a small rest of it is read and dropped (the connection then
  serves on) or, for a refused body, the connection is closed.
* A streamed answer, or a big one written from its file a piece at a time
  (:func:`write_stream`, on both paths): one loop over an :class:`AnswerSink`, the transport
  of either path (:class:`ResponseSink` for aiohttp's, :class:`ConnectionSink` for the direct
  path's), with the call service's handling of its ends: a client that left abandons the call,
  a stream cut short after its head (its generator failed, its process died, it went silent)
  ends the connection without the body's end, the only signal left.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import http
import logging
import re
import time
from typing import TYPE_CHECKING, Final, Protocol

from aiohttp import web, web_protocol
from aiohttp.http import SERVER_SOFTWARE, StreamWriter

from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse
from abeja_runtime.front.accounting import StreamEnd
from abeja_runtime.front.pending import StreamFailed
from abeja_runtime.front.stream_limits import StreamIdle, StreamLimits, StreamTooLong
from abeja_runtime.logs import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.calls import CallService
    from abeja_runtime.front.connection import Connection
    from abeja_runtime.front.pending import PendingCall

__all__ = [
    "EMPTY_BODY_STATUSES",
    "AnswerSink",
    "ConnectionSink",
    "ResponseSink",
    "answer_head",
    "checked_head",
    "refuse",
    "send_reply",
    "send_whole",
    "unsendable",
    "web_response",
    "write_stream",
]

_log = logging.getLogger("abeja_runtime")

Headers = tuple[tuple[str, str], ...]

#: Statuses whose answers have no body, and no Content-Length (as aiohttp sends them).
EMPTY_BODY_STATUSES: Final = frozenset((204, 304, *range(100, 200)))
#: What a header must not hold besides its line's end (aiohttp refuses the same in names
#: and values, and line breaks: header injection).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SERVER_LINE: Final = f"Server: {SERVER_SOFTWARE}\r\n"
#: After an answer given before the body was read (a 413, a 400), how much more of the body is
#: read and thrown away, and for how long: enough for a client still sending to see its answer
#: (and, for a small rest, to keep the connection), far from a whole refused body.
_REFUSED_BODY_READ: Final = 1024 * 1024
_REFUSED_BODY_WAIT: Final = 1.0


# -- the head -------------------------------------------------------------------------------


def answer_head(
    status: int, headers: Headers, request_id: str, length: int | None, *, close: bool
) -> bytes:
    """The status line and headers of an answer (the module's docstring lists them), with a
    body of ``length`` bytes, or chunked (``None``). ``ValueError`` for a header that would
    split the answer or cannot be encoded (:func:`checked_head`; the request id cannot:
    :func:`~abeja_runtime.logs.request_id_from` made sure)."""
    if status in EMPTY_BODY_STATUSES:
        framing = ""
    elif length is None:
        framing = "Transfer-Encoding: chunked\r\n"
    else:
        framing = f"Content-Length: {length}\r\n"
    date = f"Date: {_http_date(int(time.time()))}\r\n"
    end = "Connection: close\r\n\r\n" if close else "\r\n"
    return (
        f"{checked_head(status, headers)}{REQUEST_ID_HEADER}: {request_id}\r\n"
        f"{framing}{date}{_SERVER_LINE}{end}"
    ).encode()


@functools.lru_cache(maxsize=256)
def checked_head(status: int, headers: Headers) -> str:
    """The status line and the handler's headers, checked (``ValueError`` for a line break or
    another control character, or text that cannot be encoded): a handler answers with the
    same few sets of headers, so each is written and scanned once (0.8 µs a request)."""
    lines = [f"HTTP/1.1 {status} {_reason(status)}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    given = "".join(lines)
    # One line each, and no other control character: three scans of the whole text instead
    # of two per header.
    ends = len(lines)
    if given.count("\n") != ends or given.count("\r") != ends or _CONTROL.search(given):
        raise ValueError("a header holds a line break or a control character")
    given.encode()  # UnicodeEncodeError, a ValueError, for a lone surrogate
    return given


def unsendable(exc: ValueError) -> EncodedResponse:
    """What is sent instead of an answer whose head :func:`checked_head` refused (and the log
    line saying so)."""
    _log.error("the handler's answer cannot be sent: %s", exc)
    return UNEXPECTED_ERROR


def _sendable(reply: EncodedResponse) -> EncodedResponse:
    """``reply``, or the ``500`` sent instead when its head is refused."""
    try:
        checked_head(reply.status, reply.headers)
    except ValueError as exc:
        return unsendable(exc)
    return reply


@functools.lru_cache(maxsize=2)
def _http_date(second: int) -> str:
    return email.utils.formatdate(second, usegmt=True)


@functools.cache
def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


# -- whole answers --------------------------------------------------------------------------


def send_whole(
    connection: Connection,
    entry: CallEntry,
    status: int,
    headers: Headers,
    request_id: str,
    body: bytes,
    *,
    close: bool,
) -> None:
    """Write a whole answer on the direct path: counted (its status as sent), then its head and
    body in one write. The caller ends the call and the connection's turn, whatever this
    raised."""
    try:
        head = answer_head(status, headers, request_id, len(body), close=close)
    except ValueError as exc:  # a header that would split the answer, or not encode
        reply = unsendable(exc)
        assert isinstance(reply.body, bytes)
        status, body = reply.status, reply.body
        head = answer_head(status, reply.headers, request_id, len(body), close=close)
    if status in EMPTY_BODY_STATUSES:
        body = b""
    entry.count(status)
    connection.send_direct(head, body)


def web_response(reply: EncodedResponse) -> web.Response:
    """An in-memory reply as an aiohttp response."""
    assert isinstance(reply.body, bytes), "streamed replies are written by write_stream"
    return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


def _tagged(reply: EncodedResponse, entry: CallEntry) -> web.Response:
    """The sendable ``reply`` with the request id, counted."""
    reply = _sendable(reply)
    entry.count(reply.status)
    tag = (REQUEST_ID_HEADER, entry.request_id)
    return web_response(EncodedResponse(reply.status, (*reply.headers, tag), reply.body))


async def send_reply(
    request: web.BaseRequest, entry: CallEntry, reply: EncodedResponse, *, draining: bool
) -> web.StreamResponse:
    """Write a whole answer on aiohttp's path; while the front drains, the connection ends with
    it (no next request would be admitted)."""
    response = _tagged(reply, entry)
    if draining:
        response.force_close()
    with contextlib.suppress(ConnectionError):
        await response.prepare(request)
        await response.write_eof()
        if not draining and not request.content.is_eof():
            # An answer before the body was read (a 405, a 503): take in a small rest so
            # that the connection can serve the next request.
            await _discard_rest(request)
    return response


async def refuse(
    request: web.BaseRequest, entry: CallEntry, reply: EncodedResponse
) -> web.StreamResponse:
    """Answer now and stop taking in a body we refused (413, 408, 507).

    The answer goes out first; then at most ``_REFUSED_BODY_READ`` more bytes are read, for at
    most ``_REFUSED_BODY_WAIT`` seconds, so that a client still sending sees its answer rather
    than a reset; then the connection is closed.
    """
    response = _tagged(reply, entry)
    response.force_close()
    with contextlib.suppress(ConnectionError):
        await response.prepare(request)
        await response.write_eof()
        if request.content.exception() is None:  # a stalled body: nothing more to read
            await _discard_rest(request)
    request.protocol.force_close()
    return response


async def _discard_rest(request: web.BaseRequest) -> None:
    """Read and drop at most ``_REFUSED_BODY_READ`` more bytes of the body, for at most
    ``_REFUSED_BODY_WAIT`` seconds; aiohttp closes the connection if any is left."""
    # The client may stop, reset, or send a broken chunk: all mean "done" here.
    with contextlib.suppress(
        asyncio.TimeoutError, ConnectionError, web_protocol.RequestPayloadError
    ):
        await asyncio.wait_for(_discard(request, _REFUSED_BODY_READ), _REFUSED_BODY_WAIT)


async def _discard(request: web.BaseRequest, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of the request's body."""
    taken = 0
    while taken < limit and (chunk := await request.content.readany()):
        taken += len(chunk)


# -- streamed answers, and those written from their file ------------------------------------


class AnswerSink(Protocol):
    """Where :func:`write_stream` writes an answer: one path's transport."""

    async def start(
        self, status: int, headers: Headers, request_id: str, length: int | None
    ) -> None:
        """Write the head (by :func:`answer_head`'s rules): a body of ``length`` bytes follows,
        or a chunked one (``None``)."""

    async def write(self, chunk: bytes) -> None:
        """Write a piece of the body, once the client took enough of the ones before."""

    async def end(self) -> None:
        """Write the body's end (a chunked body's last chunk)."""

    def cut(self) -> None:
        """The body was cut short after its head: end the connection without the body's end,
        so that the client sees it was cut."""


async def write_stream(
    sink: AnswerSink,
    calls: CallService,
    pending: PendingCall,
    entry: CallEntry,
    status: int,
    headers: Headers,
) -> bool:
    """Write an answer without a body in memory: streamed (chunked, each chunk written as the
    handler process sends it), or big and written from its file (with its length), a piece at
    a time as the client takes it: a slow reader holds a piece of it in the front, not all of
    it. Whether it went out whole (else the connection must end); the file is closed however
    it ends. Cut short at its limits (:mod:`~abeja_runtime.front.stream_limits`).
    ``CancelledError`` (the client left) abandons the call and is raised on."""
    file = pending.answer_file
    try:
        checked_head(status, headers)
    except ValueError as exc:
        return await _write_unsendable(sink, calls, pending, entry, exc)
    entry.streaming(status)
    limits = StreamLimits(
        calls.loop, calls.stream_idle, calls.stream_timeout if file is None else None
    )
    sent = 0
    try:
        with limits:
            await sink.start(status, headers, entry.request_id, None if file is None else file.size)
            chunks = pending.stream() if file is None else file.chunks()
            async for chunk in chunks:
                limits.progress()  # a chunk came
                await sink.write(chunk)
                sent += len(chunk)
                limits.progress()  # the client took it
    except ConnectionError:  # the client left
        entry.stream_ended(StreamEnd.CLIENT_LEFT, sent)
        calls.abandon(pending, entry)
        return False
    except RuntimeError as exc:
        # Headers are out: the only honest signal left is to cut the body short.
        entry.stream_ended(_cut_short(exc), sent)
        calls.stream_cut(pending, exc)
        sink.cut()
        return False
    except BaseException:  # the client left (cancelled), or a failure of the transport's
        entry.stream_ended(StreamEnd.CLIENT_LEFT, sent)
        calls.abandon(pending, entry)  # own: the stream is withdrawn, its worker's slot freed
        raise
    finally:
        if file is not None:
            file.close()
    entry.stream_ended(StreamEnd.COMPLETE, sent)
    try:
        await sink.end()  # the call has its whole answer: a client leaving now abandons nothing
    except ConnectionError:
        return False
    return True


def _cut_short(exc: RuntimeError) -> StreamEnd:
    """How a stream that ``exc`` cut short ended."""
    if isinstance(exc, StreamIdle):
        return StreamEnd.IDLE
    if isinstance(exc, StreamTooLong):
        return StreamEnd.TOO_LONG
    if isinstance(exc, StreamFailed) and exc.lost:
        return StreamEnd.WORKER_LOST
    return StreamEnd.FAILED


async def _write_unsendable(
    sink: AnswerSink, calls: CallService, pending: PendingCall, entry: CallEntry, exc: ValueError
) -> bool:
    """The ``500`` instead of a streamed or file-written answer whose head is refused: nobody
    reads its body (a stream is withdrawn from its process, a file closed)."""
    reply = unsendable(exc)
    if pending.answer_file is not None:
        pending.answer_file.close()
    if pending.chunks is not None:
        calls.stream_cut(pending, exc)
    entry.count(reply.status)
    body = reply.body
    assert isinstance(body, bytes)
    try:
        await sink.start(reply.status, reply.headers, entry.request_id, len(body))
        await sink.write(body)
        await sink.end()
    except ConnectionError:
        return False
    return True


class ResponseSink:
    """:class:`AnswerSink` on aiohttp's path: an aiohttp ``web.StreamResponse`` (aiohttp adds
    ``Date``, ``Server`` and the framing as :func:`answer_head` does); :attr:`response` is the
    handler's return value."""

    __slots__ = ("_draining", "_request", "response")

    def __init__(self, request: web.BaseRequest, *, draining: bool) -> None:
        self._request = request
        #: The front drains: the connection ends with the answer.
        self._draining = draining
        self.response: web.StreamResponse | None = None

    async def start(
        self, status: int, headers: Headers, request_id: str, length: int | None
    ) -> None:
        response = web.StreamResponse(
            status=status, headers=(*headers, (REQUEST_ID_HEADER, request_id))
        )
        self.response = response
        if self._draining:
            response.force_close()
        if length is None:
            response.enable_chunked_encoding()
        else:
            response.content_length = length
        await response.prepare(self._request)

    async def write(self, chunk: bytes) -> None:
        assert self.response is not None
        await self.response.write(chunk)

    async def end(self) -> None:
        assert self.response is not None
        await self.response.write_eof()

    def cut(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.close()


class ConnectionSink:
    """:class:`AnswerSink` on the direct path: the head from :func:`answer_head`, the body
    through aiohttp's ``StreamWriter`` over the connection (its chunked framing, and its wait
    for the client to take what was written)."""

    __slots__ = ("_close", "_connection", "_empty", "_writer")

    def __init__(
        self, connection: Connection, loop: asyncio.AbstractEventLoop, *, close: bool
    ) -> None:
        self._connection = connection
        self._writer = StreamWriter(connection, loop)
        #: The connection ends with the answer (``Connection: close``).
        self._close = close
        self._empty = False

    async def start(
        self, status: int, headers: Headers, request_id: str, length: int | None
    ) -> None:
        head = answer_head(status, headers, request_id, length, close=self._close)
        await self._writer.write(head)  # as it is: the body's framing starts after it
        self._empty = status in EMPTY_BODY_STATUSES
        if length is None and not self._empty:
            self._writer.enable_chunking()

    async def write(self, chunk: bytes) -> None:
        if not self._empty:
            await self._writer.write(chunk)

    async def end(self) -> None:
        await self._writer.write_eof()

    def cut(self) -> None:
        self._connection.force_close()  # the transport closes once what was written is sent
