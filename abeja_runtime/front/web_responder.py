"""How aiohttp's path writes a call's answers (:class:`WebResponder`).

The call's :class:`~abeja_runtime.front.call.Responder` on aiohttp's path hands the answer, or
the front's refusal, to the request's coroutine, which writes it (:meth:`WebResponder.response`):
a whole answer as an aiohttp ``web.Response``, checked by the same rules as on the direct path
(``answers.py``); there the answer may come before the request's body was read, so a small rest
of it is read and dropped (the connection then serves on) or, for a refused body, the
connection is closed. A streamed answer, or one written from its file, goes through
:func:`~abeja_runtime.front.answers.write_stream` over a :class:`ResponseSink`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from aiohttp import web, web_protocol

from abeja_runtime.encode import EncodedResponse, error_reply
from abeja_runtime.errors import HttpError
from abeja_runtime.frames import Answer
from abeja_runtime.front.answers import Headers, checked_head, unsendable, write_stream
from abeja_runtime.front.call import AwaitedAnswer
from abeja_runtime.logs import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.call import FrontCall

__all__ = ["ResponseSink", "WebResponder", "send_reply", "web_response"]

#: After an answer given before the body was read (a 413, a 400), how much more of the body is
#: read and thrown away, and for how long: enough for a client still sending to see its answer
#: (and, for a small rest, to keep the connection), far from a whole refused body.
_REFUSED_BODY_READ: Final = 1024 * 1024
_REFUSED_BODY_WAIT: Final = 1.0


class WebResponder(AwaitedAnswer):
    """A call's answers on aiohttp's path: kept for the request's coroutine to write."""

    __slots__ = ("_request",)

    def __init__(self, request: web.BaseRequest, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._request = request

    async def response(self, call: FrontCall) -> web.StreamResponse:
        """The call's answer once it comes, written; a client that leaves meanwhile withdraws
        the call."""
        try:
            result = await self.result
        except asyncio.CancelledError:
            call.client_left()
            raise
        request = self._request
        draining = call.service.draining
        if isinstance(result, HttpError):
            reply = error_reply(result)
            if result.ends_connection:  # the body was not read whole
                return await _refuse(request, call.entry, reply)
            return await send_reply(request, call.entry, reply, draining=draining)
        assert isinstance(result, Answer)
        if result.body is not None:
            reply = EncodedResponse(result.status, result.headers, result.body)
            return await send_reply(request, call.entry, reply, draining=draining)
        sink = ResponseSink(request, draining=draining)  # streamed, or from its file
        await write_stream(sink, call, result.status, result.headers)
        assert sink.response is not None  # its head was written, or tried
        return sink.response


def _sendable(reply: EncodedResponse) -> EncodedResponse:
    """``reply``, or the ``500`` sent instead when its head is refused."""
    try:
        checked_head(reply.status, reply.headers)
    except ValueError as exc:
        return unsendable(exc)
    return reply


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


async def _refuse(
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
