"""The front's HTTP: the service port, the health-check port, and their answers.

The front's modules are the only ones that serve HTTP (this one, ``connection.py``,
``direct.py``, ``answers.py``) or gRPC (``rpc.py``); ``arms.py``, ``datalake.py`` and
``batch.py`` use aiohttp's client. :class:`HttpServer` serves what the direct path
(``direct.py``) leaves to aiohttp: ``/health_check``, then for every other path the request's
checks (method, size, a body that makes progress), its body read whole (decoded, in memory, or
spooled to a file above the spool threshold, which travels to the handler process as a
descriptor), the call through the :class:`~abeja_runtime.front.calls.CallService` (admission,
places, deadline, accounting, as every way in), and the answer written by ``answers.py``, by
the same rules as on the direct path (from memory, as an aiohttp response; streamed as the
handler process produces it, or written from its file, through an aiohttp
``StreamResponse``). Malformed HTTP and slow request heads are answered by
:class:`~abeja_runtime.front.connection.Connection`, in the same ``{"status": message}`` JSON
as every other error. :class:`ControlServer` serves the health-check port (readiness,
liveness, metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final

from aiohttp import web
from aiohttp.streams import StreamReader

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, status_body, status_reply
from abeja_runtime.errors import (
    HttpError,
    ServiceBusy,
    ServiceUnavailable,
)
from abeja_runtime.frames import INLINE_LIMIT, Answer, Call
from abeja_runtime.front.accounting import CallEntry
from abeja_runtime.front.answers import (
    ResponseSink,
    refuse,
    send_reply,
    web_response,
    write_stream,
)
from abeja_runtime.front.arms import (
    ASYNC_ID_HEADER,
    ASYNC_TOKEN_HEADER,
    MAX_PENDING,
    ResultSender,
    async_id_problem,
)
from abeja_runtime.front.calls import Body, CallService
from abeja_runtime.front.connection import Connection
from abeja_runtime.front.content_encoding import BodyDecoder, decoder_for
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.front.pool import HandlerPool
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
from abeja_runtime.tracing import CallTrace, carrier

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
_JSON: Final = (("Content-Type", "application/json"),)


def _health_response(ready: bool) -> web.Response:
    return web_response(_HEALTHY if ready else _UNAVAILABLE)


class HttpServer:
    """The service port of the front."""

    def __init__(
        self, config: Config, pool: HandlerPool, metrics: FrontMetrics, calls: CallService
    ) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        #: What every call goes through (admission, places, deadline, accounting).
        self.calls = calls
        self.loop = calls.loop
        self._limits = BodyLimits(
            max_body_size=config.max_body_size, spool_threshold=config.spool_threshold
        )
        missing = ResultSender.missing(config.platform)
        self._async_refusal = (
            status_reply(
                501,
                f"async requests need {', '.join(missing)} to send their results to; set them, "
                f"or send the request without {ASYNC_ID_HEADER}",
            )
            if missing
            else None
        )
        self._results = ResultSender(config.platform)
        self._async_jobs: set[asyncio.Task[None]] = set()

    def own_path(self, path: str) -> bool:
        """The front answers this path itself (the health check, a style's front paths)."""
        return path == HEALTH_PATH or path in self._pool.front_paths

    async def service(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == HEALTH_PATH:
            return _health_response(self.calls.ready)
        if path in self._pool.front_paths:  # KServe's /metrics on its HTTP port
            return self.metrics_response()
        headers = request.headers
        entry = self.calls.accounting.open(
            request.method,
            path,
            time.time(),
            request_id_from(headers.get(REQUEST_ID_HEADER)),
            requester_id_from(headers.get(REQUESTER_ID_HEADER)),
            headers,
        )
        try:
            return await self._serve(request, entry)
        except Exception:  # aiohttp answers it 500
            entry.count(500)
            raise
        finally:
            entry.end()

    def metrics_response(self) -> web.Response:
        return web.Response(
            body=self._metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
        )

    async def _serve(self, request: web.BaseRequest, entry: CallEntry) -> web.StreamResponse:
        received = entry.received
        try:
            if not self.calls.admitting:
                raise ServiceUnavailable()
            check_method(request.method)
            check_declared_length(request.content_length, self._limits)
            body = await self._read_body(request, received)
        except HttpError as exc:
            reply = self.calls.refusal(exc)
            if exc.ends_connection:  # the body was not read whole
                return await refuse(request, entry, reply)
            return await self._send_reply(request, entry, reply)
        async_id = request.headers.get(ASYNC_ID_HEADER)
        if async_id:
            return await self._accept_async(request, body, async_id, entry)
        pending = self._pending(request, body, entry)
        try:
            answer = await self.calls.call(pending, received, entry)
        except HttpError as exc:
            reply = self.calls.refusal(exc)
            return await self._send_reply(request, entry, reply)
        assert isinstance(answer, Answer)
        if answer.body is not None:
            reply = EncodedResponse(answer.status, answer.headers, answer.body)
            return await self._send_reply(request, entry, reply)
        # Streamed, or written from its file (a big body).
        sink = ResponseSink(request, draining=self.calls.draining)
        await write_stream(sink, self.calls, pending, entry, answer.status, answer.headers)
        assert sink.response is not None  # its head was written, or tried
        return sink.response

    def _pending(
        self,
        request: web.BaseRequest,
        body: Body,
        entry: CallEntry,
        trace: CallTrace | None = None,
    ) -> PendingCall:
        """The call of ``request``; its spans hang from ``trace`` (an async request's job's),
        else from the entry's server span."""
        trace = entry.trace if trace is None else trace
        url = request.rel_url
        call = Call(
            self.calls.next_id(),
            request.method,
            url.raw_path,
            url.raw_query_string,
            request.raw_headers,
            entry.request_id,
            entry.requester_id,
            body.data,
            "" if body.file is None else body.file.name,
            body.size,
            carrier(trace),
        )
        return PendingCall(call, self.loop, body.fd, body.close, trace)

    async def _read_body(self, request: web.BaseRequest, received: float) -> Body:
        """The whole body, counted against the limit: in the frame up to
        :data:`~abeja_runtime.frames.INLINE_LIMIT`, in shared memory up to the spool threshold,
        in a spool file above it."""
        content = request.content
        if request.method == "GET" or content.at_eof():  # a GET's query is its body
            return Body(b"")
        decoder = decoder_for(request.headers.get("Content-Encoding"))
        declared = request.content_length
        if declared is not None and declared <= INLINE_LIMIT and decoder is None:
            return await self._read_in_time(request, received, decoder, in_place=False)
        await self.calls.enter_gate()  # a compressed body may grow past the inline limit
        try:
            body = await self._read_in_time(request, received, decoder, in_place=True)
        except BaseException:
            self.calls.gate.leave()
            raise
        body.gate = self.calls.gate
        return body

    async def _read_in_time(
        self,
        request: web.BaseRequest,
        received: float,
        decoder: BodyDecoder | None,
        *,
        in_place: bool,
    ) -> Body:
        """The body read whole, or ``408`` when it is still arriving at the request's deadline
        (a client trickling a byte now and then would otherwise hold its place for ever), or,
        ``in_place``, when it arrives slower than the minimum rate."""
        left = self.calls.time_left(received)
        if left is None or request.content.is_eof():
            return await self._read_whole(request, decoder, in_place, left)
        try:
            async with asyncio.timeout(left):
                return await self._read_whole(request, decoder, in_place, left)
        except TimeoutError:
            raise self.calls.body_past_deadline() from None

    async def _read_whole(
        self,
        request: web.BaseRequest,
        decoder: BodyDecoder | None,
        in_place: bool,
        time_left: float | None,
    ) -> Body:
        """The body, decoded (``decoder``), counted against the limit as it grows; one that
        holds a place (``in_place``) and could not be whole within ``time_left`` is cut early
        (``Connection.watch_body``)."""
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
        buffers = self.calls.buffers
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

    async def _send_reply(
        self, request: web.BaseRequest, entry: CallEntry, reply: EncodedResponse
    ) -> web.StreamResponse:
        """A whole answer (``answers.py``), the connection ended with it while draining."""
        return await send_reply(request, entry, reply, draining=self.calls.draining)

    async def _accept_async(
        self,
        request: web.BaseRequest,
        body: Body,
        async_id: str,
        entry: CallEntry,
    ) -> web.StreamResponse:
        """Answer 202 now; the call runs in a task, and its answer goes to the platform."""
        tag = (REQUEST_ID_HEADER, entry.request_id)
        problem = async_id_problem(async_id)
        refusal = status_reply(400, problem) if problem else self._async_refusal
        if refusal is None and len(self._async_jobs) >= MAX_PENDING:
            refusal = self.calls.refusal(ServiceBusy())
        if refusal is not None:
            body.close()
            return await self._send_reply(request, entry, refusal)
        job_trace = None if entry.trace is None else entry.trace.job(async_id)
        pending = self._pending(request, body, entry, job_trace)
        token = request.headers.get(ASYNC_TOKEN_HEADER) or ""
        self.calls.accounting.hold()  # until the result is sent: a graceful shutdown waits for it
        job = asyncio.create_task(self._run_async(pending, async_id, token, tag, entry.received))
        self._async_jobs.add(job)
        job.add_done_callback(self._async_jobs.discard)
        entry.count(202)
        response = web.Response(status=202, headers=(*_JSON, tag))
        response.force_close()
        return response

    async def _run_async(
        self,
        pending: PendingCall,
        async_id: str,
        token: str,
        tag: tuple[str, str],
        received: float,
    ) -> None:
        """Run the call, and send its result (or ABEJA's failure document) to the platform;
        the job's span (``pending.trace``) ends with the result's status once it is sent."""
        status = 500  # the job failed, unless a reply is sent
        try:
            try:
                answer = await self.calls.call(pending, received, None)  # (no client waits)
            except HttpError as exc:  # a timeout or a full queue: the answer a client would get
                reply = self.calls.refusal(exc)
            else:
                assert isinstance(answer, Answer)
                if answer.failed:  # logged in the handler process
                    await self._results.send_failure(async_id, token, "response from runtime")
                    return
                data = answer.body
                if answer.streamed:
                    data = b"".join([chunk async for chunk in pending.stream()])
                elif data is None and pending.answer_file is not None:  # a big body
                    data = pending.answer_file.read()
                    pending.answer_file.close()
                assert data is not None
                reply = EncodedResponse(answer.status, answer.headers, data)
            status = reply.status
            await self._results.send_result(async_id, token, reply.with_headers((tag,)))
        except Exception:
            _log.exception("async request %s failed", async_id)
            await self._results.send_failure(async_id, token, "response from runtime")
        finally:
            if pending.answer_file is not None:  # not read: a failed answer, or a failure
                pending.answer_file.close()  # (closing twice is nothing)
            if pending.trace is not None:
                pending.trace.status(status)
                pending.trace.end()
            self.calls.accounting.release()


async def _next_chunk(content: StreamReader) -> bytes:
    """The body's next piece as it was received (``b""`` at its end): aiohttp's ``readany()``
    joins all it holds, one more copy of a body that arrived whole (18 % of the front's work
    for a 1 MiB request)."""
    while True:
        chunk, end_of_http_chunk = await content.readchunk()
        if chunk or not end_of_http_chunk:  # (b"", False) is the end of the body
            return chunk


async def _body_pieces(content: StreamReader, decoder: BodyDecoder | None) -> AsyncIterator[bytes]:
    """The body's pieces as received, or as decoded (then ``400`` for a stream cut short)."""
    while chunk := await _next_chunk(content):
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

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == HEALTH_PATH:
            return _health_response(self._is_ready())
        if path == LIVENESS_PATH:
            return web_response(_HEALTHY)
        if path == METRICS_PATH:
            return web.Response(
                body=self._render_metrics(), headers={"Content-Type": METRICS_CONTENT_TYPE}
            )
        return web_response(
            status_reply(
                404,
                f"not found: this port serves only {HEALTH_PATH}, {LIVENESS_PATH} and "
                f"{METRICS_PATH}",
            )
        )
