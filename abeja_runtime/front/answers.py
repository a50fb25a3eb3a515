"""How the front writes an answer to a client (aiohttp's path writes its whole answers in
``web_responder.py``).

An answer whose head the client could misread (:mod:`abeja_runtime.http_head`) is not sent: it
becomes the runtime's own ``500``, and the log says why (:func:`unsendable`). A whole answer on
the direct path is written from the answer's callback (:func:`send_whole`: the hot path, nothing
made per request but the head's bytes); a streamed answer, or a big one written from its file,
by one loop on both paths (:func:`write_stream`) over an :class:`AnswerSink`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from aiohttp.http import StreamWriter

from abeja_runtime.encode import UNEXPECTED_ERROR, EncodedResponse
from abeja_runtime.front.pending import StreamFailed
from abeja_runtime.http_head import EMPTY_BODY_STATUSES, Headers, answer_head, checked_head
from abeja_runtime.stream_limits import StreamEnd, StreamIdle, StreamLimits, StreamTooLong

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.call import FrontCall
    from abeja_runtime.front.connection import Connection

__all__ = [
    "AnswerSink",
    "ConnectionSink",
    "send_whole",
    "unsendable",
    "write_stream",
]

_log = logging.getLogger("abeja_runtime")


def unsendable(exc: ValueError) -> EncodedResponse:
    """What is sent instead of an answer whose head :func:`checked_head` refused (and the log
    line saying so)."""
    _log.error("the handler's answer cannot be sent: %s", exc)
    return UNEXPECTED_ERROR


def send_whole(
    connection: Connection,
    entry: CallEntry,
    status: int,
    headers: Headers,
    body: bytes,
    *,
    close: bool,
) -> None:
    """Write a whole answer on the direct path, counted (its status as sent), in one write; the
    caller ends the entry and the connection's turn, whatever this raised."""
    request_id = entry.request_id
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


async def write_stream(sink: AnswerSink, call: FrontCall, status: int, headers: Headers) -> bool:
    """Write an answer without a body in memory: streamed (chunked, as the handler process sends
    it), or from its file (with its length), a piece at a time as the client takes it; cut short
    at its limits (:mod:`~abeja_runtime.stream_limits`): after its head, the connection ends
    without the body's end, the only signal left. Whether it went out whole (else the
    connection must end). ``CancelledError`` (the client left) withdraws the call."""
    pending, entry, service = call.ticket, call.entry, call.service
    assert pending is not None
    file = pending.answer_file
    try:
        checked_head(status, headers)
    except ValueError as exc:
        return await _write_unsendable(sink, call, exc)
    entry.streaming(status, chunked=file is None)
    limits = StreamLimits(
        service.loop, service.stream_idle, service.stream_timeout if file is None else None
    )
    sent = 0
    try:
        with limits:
            await sink.start(status, headers, entry.request_id, None if file is None else file.size)
            chunks = pending.stream() if file is None else file.chunks()
            async for chunk in chunks:
                limits.progress()  # a chunk came
                entry.chunk_sent()
                await sink.write(chunk)
                sent += len(chunk)
                limits.progress()  # the client took it
    except ConnectionError:  # the client left
        entry.stream_ended(StreamEnd.CLIENT_LEFT, sent)
        call.client_left()
        return False
    except RuntimeError as exc:
        # Headers are out: the only honest signal left is to cut the body short.
        entry.stream_ended(_cut_short(exc), sent)
        call.cut(exc)
        sink.cut()
        return False
    except BaseException:  # the client left (cancelled), or a failure of the transport's
        entry.stream_ended(StreamEnd.CLIENT_LEFT, sent)
        call.client_left()  # own: the stream is withdrawn, its worker's slot freed
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


async def _write_unsendable(sink: AnswerSink, call: FrontCall, exc: ValueError) -> bool:
    """The ``500`` instead of a streamed or file-written answer whose head is refused: nobody
    reads its body (a stream is withdrawn from its process, a file closed)."""
    reply = unsendable(exc)
    pending, entry = call.ticket, call.entry
    assert pending is not None
    if pending.answer_file is not None:
        pending.answer_file.close()
    if pending.chunks is not None:
        call.cut(exc)
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


class ConnectionSink:
    """:class:`AnswerSink` on the direct path: the body through aiohttp's ``StreamWriter`` (its
    chunked framing, its wait for the client to take what was written)."""

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
