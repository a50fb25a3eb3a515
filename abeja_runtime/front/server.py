"""The front's HTTP: the service port's requests that aiohttp handles, and the health-check port.

:class:`HttpServer` serves what the direct path (``direct.py``) leaves to aiohttp: the front's own
paths, then the request's checks (method, size, a body that makes progress), its body read whole
(decoded, in memory, or spooled to a file above the spool threshold), and its call, whose answer
the :class:`~abeja_runtime.front.web_responder.WebResponder` writes; an async (ARMS) request's
call is a job (``async_jobs.py``). :class:`ControlServer` serves the health-check port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

from aiohttp.streams import StreamReader
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, error_reply, status_body, status_reply
from abeja_runtime.errors import HttpError, Unauthorized
from abeja_runtime.frames import INLINE_LIMIT, Call
from abeja_runtime.front.async_jobs import ASYNC_ID_HEADER, AsyncJobs
from abeja_runtime.front.body import Body
from abeja_runtime.front.call import FrontCall
from abeja_runtime.front.connection import Connection
from abeja_runtime.front.content_encoding import BodyDecoder, decoder_for
from abeja_runtime.front.pool import HandlerPool
from abeja_runtime.front.service import CallHead, CallService
from abeja_runtime.front.web_responder import WebResponder, web_response
from abeja_runtime.limits import BodyCounter, BodyLimits, check_declared_length, check_method
from abeja_runtime.logs import (
    REQUEST_ID_HEADER,
    REQUESTER_ID_HEADER,
    request_id_from,
    requester_id_from,
)
from abeja_runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from abeja_runtime.metrics import FrontMetrics
from abeja_runtime.spool import Scratch, Spool

__all__ = [
    "HEALTH_PATH",
    "LIVENESS_PATH",
    "METRICS_PATH",
    "ControlServer",
    "HttpServer",
]

_log = logging.getLogger("abeja_runtime")

HEALTH_PATH: Final = "/health_check"
#: Liveness for kubelets: 200 while the front answers at all (readiness is HEALTH_PATH).
LIVENESS_PATH: Final = "/livez"
METRICS_PATH: Final = "/metrics"
_HEALTHY: Final = EncodedResponse(200, (("Content-Type", "application/json"),), status_body("ok"))
_UNAVAILABLE: Final = status_reply(503, "service unavailable")


def _health_response(ready: bool) -> Response:
    return web_response(_HEALTHY if ready else _UNAVAILABLE)


def _metrics_response(render: Callable[[], bytes]) -> Response:
    return Response(body=render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


class HttpServer:
    """The service port of the front."""

    def __init__(
        self, config: Config, pool: HandlerPool, metrics: FrontMetrics, service: CallService
    ) -> None:
        self._pool = pool
        self._metrics = metrics
        #: Where calls begin, and what they share.
        self.call_service = service
        self._limits = BodyLimits(
            max_body_size=config.max_body_size, spool_threshold=config.spool_threshold
        )
        self._jobs = AsyncJobs(config.platform, service, self.frame)

    def own_path(self, path: str) -> bool:
        """The front answers this path itself (the health check, a style's front paths)."""
        return path == HEALTH_PATH or path in self._pool.front_paths

    async def service(self, request: BaseRequest) -> StreamResponse:
        path = request.path
        if path == HEALTH_PATH:
            return _health_response(self.call_service.ready)
        if path in self._pool.front_paths:  # KServe's /metrics on its HTTP port
            try:
                self.call_service.caller(request.headers)
            except Unauthorized as exc:
                return web_response(error_reply(exc))
            return _metrics_response(self._metrics.render)
        headers = request.headers
        request_id = request_id_from(headers.get(REQUEST_ID_HEADER))
        requester_id = requester_id_from(headers.get(REQUESTER_ID_HEADER))
        head = CallHead(request.method, path, time.time(), request_id, requester_id, headers)
        responder = WebResponder(request, self.call_service.loop)
        call = self.call_service.begin(head, responder)
        try:
            async_id = await self._submit(request, call)
            if async_id:
                return await self._jobs.accept(request, call, async_id)
            return await responder.response(call)
        except Exception:  # aiohttp answers it 500
            call.entry.count(500)
            raise
        finally:
            call.finish()

    async def _submit(self, request: BaseRequest, call: FrontCall) -> str | None:
        """Read the request's body and submit its call, or refuse it; an async request's id,
        whose call is left to :class:`~abeja_runtime.front.async_jobs.AsyncJobs`."""
        try:
            call.admit(request.headers)
            check_method(request.method)
            check_declared_length(request.content_length, self._limits)
            body = await self._read_body(request, call)
        except HttpError as exc:
            call.refuse(exc)
            return None
        call.body = body
        async_id = request.headers.get(ASYNC_ID_HEADER)
        if not async_id:
            call.submit(self.frame(request, call, body), body)
        return async_id

    @staticmethod
    def frame(request: BaseRequest, call: FrontCall, body: Body) -> Call:
        """The call frame of ``request``."""
        spool_path = "" if body.file is None else body.file.name
        return call.frame(
            request.method, request.rel_url, request.raw_headers, body.data, body.size, spool_path
        )

    async def _read_body(self, request: BaseRequest, call: FrontCall) -> Body:
        """The whole body, counted against the limit: in the frame, in shared memory up to the
        spool threshold, in a spool file above it; ``408`` when it is still arriving at the
        call's deadline. One that may pass the inline limit (a compressed one too) takes a
        place first."""
        content = request.content
        if request.method == "GET" or content.at_eof():  # a GET's query is its body
            return Body(b"")
        decoder = decoder_for(request.headers.get("Content-Encoding"))
        declared = request.content_length
        in_place = declared is None or declared > INLINE_LIMIT or decoder is not None
        bodies = self.call_service.bodies
        if in_place:
            await bodies.enter(call.deadline, call.caller_budget)
        left = bodies.time_left(call.deadline)
        timer = asyncio.timeout(None if content.is_eof() else left)
        try:
            async with timer:
                body = await self._read_whole(request, decoder, in_place, left)
        except BaseException as exc:
            if in_place:
                bodies.gate.leave()
            if isinstance(exc, TimeoutError) and timer.expired():
                raise bodies.past_deadline(call.caller_budget) from None
            raise
        if in_place:
            body.gate = bodies.gate
        return body

    async def _read_whole(
        self,
        request: BaseRequest,
        decoder: BodyDecoder | None,
        in_place: bool,
        time_left: float | None,
    ) -> Body:
        """The body, decoded (``decoder``), counted against the limit as it grows, watched
        (``Connection.watch_body``: a body ``in_place`` is cut when it arrives too slowly)."""
        content = request.content
        counter = BodyCounter(self._limits.max_body_size)
        threshold = self._limits.spool_threshold
        chunks: list[bytes] = []
        if not content.is_eof():
            protocol = request.protocol
            assert isinstance(protocol, Connection)
            protocol.watch_body(  # still arriving
                lambda: not content.is_eof() and content.exception() is None,
                content.set_exception,
                (lambda: content.total_bytes) if in_place else None,
                request.content_length,
                time_left,
            )
            if request.headers.get("Expect", "").lower() == "100-continue":
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        pieces = _body_pieces(content, decoder)
        while counter.total <= threshold:
            chunk = await anext(pieces, b"")
            if not chunk:
                return self._in_memory(chunks, counter.total)
            counter.add(chunk)
            chunks.append(chunk)
        return await self._spool(pieces, chunks, counter)

    def _in_memory(self, chunks: list[bytes], size: int) -> Body:
        if size <= INLINE_LIMIT:
            return Body(b"".join(chunks))
        buffers = self.call_service.bodies.buffers
        return Body(None, fd=buffers.fill(chunks, size), size=size, buffers=buffers)

    async def _spool(
        self, pieces: AsyncIterator[bytes], first: list[bytes], counter: BodyCounter
    ) -> Body:
        """A body above the spool threshold, in a file of its own request's scratch folder."""
        scratch = Scratch()
        spool = Spool(scratch, 0)
        try:
            for chunk in first:
                spool.write(chunk)
            async for chunk in pieces:
                counter.add(chunk)
                spool.write(chunk)
            file = spool.finish()
        except BaseException:
            spool.discard()
            scratch.remove()
            raise
        return Body(None, file=file, scratch=scratch)


async def _body_pieces(content: StreamReader, decoder: BodyDecoder | None) -> AsyncIterator[bytes]:
    """The body's pieces as received (aiohttp's ``readany()`` would join all it holds, one more
    copy of a body that arrived whole), or as decoded (then ``400`` for a stream cut short)."""
    while True:
        chunk, end_of_http_chunk = await content.readchunk()
        if not chunk:
            if end_of_http_chunk:  # an HTTP chunk's end: the body goes on
                continue
            break  # (b"", False) is the end of the body
        if decoder is None:
            yield chunk
        else:
            for piece in decoder.feed(chunk):
                yield piece
    if decoder is not None:
        decoder.finish()


class ControlServer:
    """The health-check port, served by the front whatever any handler process does.

    ``/health_check`` is readiness (200 while a worker is ready to take requests, 503 while none
    is, and from the start of a shutdown), ``/livez`` is liveness (200 while the front
    answers), ``/metrics`` the Prometheus scrape.
    """

    def __init__(self, is_ready: Callable[[], bool], render_metrics: Callable[[], bytes]) -> None:
        self._is_ready = is_ready
        self._render_metrics = render_metrics

    async def handle(self, request: BaseRequest) -> StreamResponse:
        path = request.path
        if path == HEALTH_PATH:
            return _health_response(self._is_ready())
        if path == LIVENESS_PATH:
            return web_response(_HEALTHY)
        if path == METRICS_PATH:
            return _metrics_response(self._render_metrics)
        return web_response(
            status_reply(
                404,
                f"not found: this port serves only {HEALTH_PATH}, {LIVENESS_PATH} and "
                f"{METRICS_PATH}",
            )
        )
