"""How aiohttp's path writes a call's answers (:class:`WebResponder`): the request's coroutine
writes the answer, or the front's refusal, once it comes: a whole one as an aiohttp ``Response``,
checked by the same rules as on the direct path (``answers.py``), a streamed or file-written one
through :func:`~abeja_runtime.front.answers.write_stream` over a :class:`ResponseSink`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from aiohttp import web_protocol
from aiohttp.http import HttpVersion11
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from abeja_runtime.encode import EncodedResponse, error_reply
from abeja_runtime.errors import HttpError
from abeja_runtime.frames import Answer
from abeja_runtime.front.answers import unsendable, write_stream
from abeja_runtime.front.call import AwaitedAnswer
from abeja_runtime.http_head import Headers, checked_head
from abeja_runtime.logs import REQUEST_ID_HEADER

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.call import FrontCall

__all__ = ["ResponseSink", "WebResponder", "web_response"]

#: After an answer given before the body was read (a 413, a 400), how much more of the body is
#: read and thrown away, and for how long: enough for a client still sending to see its answer
#: (and, for a small rest, to keep the connection), far from a whole refused body.
_REFUSED_BODY_READ: Final = 1024 * 1024
_REFUSED_BODY_WAIT: Final = 1.0


class WebResponder(AwaitedAnswer):
    """A call's answers on aiohttp's path: kept for the request's coroutine to write."""

    __slots__ = ("_request",)

    def __init__(self, request: BaseRequest, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._request = request

    async def response(self, call: FrontCall) -> StreamResponse:
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
            refused = result.ends_connection  # the body was not read whole
            return await _send(request, call.entry, reply, draining=draining, refused=refused)
        assert isinstance(result, Answer)
        if result.body is not None:
            reply = EncodedResponse(result.status, result.headers, result.body)
            return await _send(request, call.entry, reply, draining=draining)
        sink = ResponseSink(request, draining=draining)  # streamed, or from its file
        await write_stream(sink, call, result.status, result.headers)
        assert sink.response is not None  # its head was written, or tried
        return sink.response


def web_response(reply: EncodedResponse) -> Response:
    """An in-memory reply as an aiohttp response."""
    assert isinstance(reply.body, bytes), "streamed replies are written by write_stream"
    return Response(status=reply.status, body=reply.body, headers=reply.headers)


async def _send(
    request: BaseRequest,
    entry: CallEntry,
    reply: EncodedResponse,
    *,
    draining: bool,
    refused: bool = False,
) -> StreamResponse:
    """Write a whole answer on aiohttp's path; while the front drains, or when it refuses a
    body not read whole (413, 408, 507), the connection ends with it. An answer before the body
    was read (a 405, a 503, a refusal) is followed by a read of at most ``_REFUSED_BODY_READ``
    more bytes, for at most ``_REFUSED_BODY_WAIT`` seconds, so that a client still sending sees
    its answer rather than a reset (and, for a small rest, keeps its connection). An answer
    whose head is refused becomes the ``500`` (:func:`unsendable`)."""
    try:
        checked_head(reply.status, reply.headers)
    except ValueError as exc:
        reply = unsendable(exc)
    entry.count(reply.status)
    tag = (REQUEST_ID_HEADER, entry.request_id)
    response = web_response(EncodedResponse(reply.status, (*reply.headers, tag), reply.body))
    if draining or refused:
        response.force_close()
    content = request.content
    # The client may stop, reset, or send a broken chunk: all mean "done" here.
    with contextlib.suppress(
        asyncio.TimeoutError, ConnectionError, web_protocol.RequestPayloadError
    ):
        await response.prepare(request)
        await response.write_eof()
        if (refused or not draining) and not content.is_eof() and content.exception() is None:
            async with asyncio.timeout(_REFUSED_BODY_WAIT):
                taken = 0
                while taken < _REFUSED_BODY_READ and (chunk := await content.readany()):
                    taken += len(chunk)
    if refused:
        request.protocol.force_close()
    return response


class ResponseSink:
    """:class:`AnswerSink` on aiohttp's path: an aiohttp ``StreamResponse``, :attr:`response`,
    the handler's return value."""

    __slots__ = ("_draining", "_request", "response")

    def __init__(self, request: BaseRequest, *, draining: bool) -> None:
        self._request = request
        #: The front drains: the connection ends with the answer.
        self._draining = draining
        self.response: StreamResponse | None = None

    async def start(
        self, status: int, headers: Headers, request_id: str, length: int | None
    ) -> None:
        response = StreamResponse(
            status=status, headers=(*headers, (REQUEST_ID_HEADER, request_id))
        )
        self.response = response
        if self._draining:
            response.force_close()
        if length is None and self._request.version >= HttpVersion11:
            response.enable_chunked_encoding()  # (HTTP/1.0: the body ends at the close)
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
