"""The HTTP layer: aiohttp's low-level server, health checks, and the one error → response map.

This is the only module that imports aiohttp. It turns an aiohttp request into the parts that
``decode.py`` understands, hands the call to the executor, and writes the encoded response (from
memory, or streamed chunk by chunk). Every known error becomes ``{"status": message}`` JSON with
its status code here, and only here; anything unexpected becomes ``500 unexpected error occurred``
plus one log line for the handler's author.

Two small servers run in the supervisor, not in workers, so that they answer whatever a worker
does: :class:`ControlServer` on the health-check port (readiness, liveness, metrics), and
:func:`answer_unavailable` on the service port while no worker is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web, web_protocol

from abeja_runtime import __version__
from abeja_runtime.config import Config
from abeja_runtime.decode import BodyLimits, check_declared_length, check_method, decode_request
from abeja_runtime.encode import EncodedResponse, encode_result
from abeja_runtime.errors import (
    HandlerResultError,
    HttpError,
    PayloadTooLarge,
    ServiceBusy,
    ServiceUnavailable,
)
from abeja_runtime.execute import Execution, Executor
from abeja_runtime.handler import LoadedHandler
from abeja_runtime.logs import AccessLog, request_id_var, requester_id_var, user_exc_info
from abeja_runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from abeja_runtime.metrics import WorkerMetrics
from abeja_runtime.request import Request

__all__ = [
    "HEALTH_PATH",
    "LIVENESS_PATH",
    "METRICS_PATH",
    "ControlServer",
    "HttpServer",
    "ServingState",
    "answer_unavailable",
    "make_web_server",
]

_log = logging.getLogger("abeja_runtime")

HEALTH_PATH: Final = "/health_check"
#: Liveness for kubelets: 200 while the supervisor answers at all (readiness is HEALTH_PATH).
LIVENESS_PATH: Final = "/livez"
METRICS_PATH: Final = "/metrics"
RUNTIME_VERSION_HEADER: Final = "x-abeja-sys-meta-runtime-version"
REQUEST_ID_HEADER: Final = "x-abeja-request-id"
REQUESTER_ID_HEADER: Final = "x-abeja-requester-id"
_JSON: Final = "application/json"
#: After a 413, how much more of the refused body is read (and thrown away), and for how long,
#: before the connection is closed: enough for a client to notice its answer, far from a body.
_REFUSED_BODY_READ: Final = 1024 * 1024
_REFUSED_BODY_WAIT: Final = 1.0


@dataclass
class ServingState:
    """What the health check reports, and the count that graceful shutdown waits on."""

    handler: LoadedHandler | None = None
    draining: bool = False
    in_flight: int = 0
    #: Connections to close after their next response, as the supervisor asked (rebalancing).
    shed: int = 0
    idle_waiters: list[Any] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        return self.handler is not None and not self.draining

    def request_done(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            for waiter in self.idle_waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.idle_waiters.clear()


def _error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The one shape of every error the runtime answers itself: ``{"status": message}`` JSON."""
    return web.Response(
        status=status,
        body=json.dumps({"status": message}).encode(),
        headers={"Content-Type": _JSON, **(headers or {})},
    )


_HEALTHY: Final = json.dumps({"status": "ok"}).encode()


class HttpServer:
    """Serves the handler on the service port, and that worker's own ``/health_check``."""

    def __init__(
        self, config: Config, executor: Executor, state: ServingState, metrics: WorkerMetrics
    ) -> None:
        self._config = config
        self._executor = executor
        self._state = state
        self._metrics = metrics
        self._limits = BodyLimits(
            max_body_size=config.max_body_size, spool_threshold=config.spool_threshold
        )
        self._extra_headers = (
            (RUNTIME_VERSION_HEADER, __version__),
            *config.platform.response_headers(),
        )
        self._encode = functools.partial(encode_result, extra_headers=self._extra_headers)
        self._access_log = AccessLog(config.platform.log_fields())

    async def service(self, request: web.BaseRequest) -> web.StreamResponse:
        """The service port: any path runs the handler, except ``/health_check``."""
        if request.path == HEALTH_PATH:
            return _health_response(self._state.ready)
        received = time.time()
        request_id = request.headers.get(REQUEST_ID_HEADER) or os.urandom(16).hex()
        request_token = request_id_var.set(request_id)
        requester_token = requester_id_var.set(request.headers.get(REQUESTER_ID_HEADER))
        self._state.in_flight += 1
        response: web.StreamResponse | None = None
        try:
            response = await self._serve(request, request_id, received)
            if not response.prepared:  # else _head ran before it was sent
                self._head(request, response, request_id, received)
            return response
        finally:
            self._state.request_done()
            if response is None:  # only an unexpected error of the runtime's own gets here
                self._account(request, 500, received)
            request_id_var.reset(request_token)
            requester_id_var.reset(requester_token)

    async def _serve(
        self, request: web.BaseRequest, request_id: str, received: float
    ) -> web.StreamResponse:
        try:
            handler = self._state.handler
            # While draining, a request that arrives on a connection this worker already has is
            # still served (and the connection closed after it): a load balancer may have sent
            # it before it saw readiness go 503. New connections are no longer accepted.
            if handler is None:
                raise ServiceUnavailable()
            check_method(request.method)
            check_declared_length(request.content_length, self._limits)
            if request.headers.get("Expect", "").lower() == "100-continue":
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            user_request = await decode_request(
                method=request.method,
                raw_path=request.rel_url.raw_path,
                raw_query=request.rel_url.raw_query_string,
                headers=request.headers.items(),
                body=request.content.iter_any(),
                limits=self._limits,
                request_id=request_id,
            )
        except PayloadTooLarge as exc:
            response = self._http_error(exc)
            self._head(request, response, request_id, received)
            return await self._refuse_body(request, response)
        except HttpError as exc:
            return self._http_error(exc)
        try:
            execution = await self._execute(handler, user_request)
            try:
                return await self._send(request, execution, request_id, received)
            finally:
                execution.close()  # lets the handler thread take its next call
        except HttpError as exc:
            return self._http_error(exc)
        except HandlerResultError as exc:
            _log.error("the handler's return value breaks the contract: %s", exc)
        except Exception as exc:
            _log.error(
                "unexpected error occurred in the handler %s",
                handler.name,
                exc_info=user_exc_info(exc),
            )
        finally:
            user_request.close()
        return _error_response(500, "unexpected error occurred")

    async def _refuse_body(
        self, request: web.BaseRequest, response: web.Response
    ) -> web.StreamResponse:
        """Answer now and stop taking in a body we refused (413).

        The answer goes out first; then at most ``_REFUSED_BODY_READ`` more bytes are read, for
        at most ``_REFUSED_BODY_WAIT`` seconds, so that a client still sending sees its answer
        rather than a reset; then the connection is closed.
        """
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        # The client may stop, reset, or send a broken chunk: all mean "done" here.
        with contextlib.suppress(
            asyncio.TimeoutError, ConnectionError, web_protocol.RequestPayloadError
        ):
            await asyncio.wait_for(_discard(request, _REFUSED_BODY_READ), _REFUSED_BODY_WAIT)
        request.protocol.force_close()
        return response

    def _http_error(self, exc: HttpError) -> web.Response:
        response = _error_response(exc.status, exc.message, exc.headers)
        if isinstance(exc, ServiceBusy):
            self._metrics.rejected("busy")
        elif isinstance(exc, ServiceUnavailable):
            self._metrics.rejected("unavailable")
        return response

    async def _execute(self, handler: LoadedHandler, request: Request) -> Execution:
        context = copy.deepcopy(self._config.context) if self._config.context else {}
        if handler.is_async:
            call = functools.partial(handler.func, request, context)
        else:
            call = functools.partial(_call_and_encode, handler.func, request, context, self._encode)
        return await self._executor.execute(call, is_async=handler.is_async, encode=self._encode)

    def _head(
        self,
        request: web.BaseRequest,
        response: web.StreamResponse,
        request_id: str,
        received: float,
    ) -> None:
        """Runs once per response, before its head is sent: what every response carries, and
        its accounting. Counting before the first byte leaves means a client never holds an
        answer that a scrape (or a crash of this worker right after) does not count."""
        response.headers[REQUEST_ID_HEADER] = request_id
        state = self._state
        if state.draining:
            response.force_close()
        elif state.shed and request.keep_alive:
            state.shed -= 1
            response.force_close()
        self._account(request, response.status, received)

    def _account(self, request: web.BaseRequest, status: int, received: float) -> None:
        responded = time.time()
        self._access_log.record(request.method, request.path, status, received, responded)
        self._metrics.observe(status, responded - received)

    async def _send(
        self, request: web.BaseRequest, execution: Execution, request_id: str, received: float
    ) -> web.StreamResponse:
        """Write the response to the socket before returning, so that once ``execution`` is
        closed a crash of the worker (the next call's ``os._exit``) cannot lose it."""
        encoded: EncodedResponse = execution.response
        if execution.stream is None:
            answer = web.Response(status=encoded.status, body=encoded.body, headers=encoded.headers)
            self._head(request, answer, request_id, received)
            await answer.prepare(request)
            await answer.write_eof()
            return answer
        response = web.StreamResponse(status=encoded.status, headers=encoded.headers)
        self._head(request, response, request_id, received)
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            async for chunk in execution.stream:
                await response.write(chunk)
        except ConnectionError:
            return response  # the client went away; nothing left to tell it
        except Exception as exc:
            # Headers are out: the only honest signal left is to cut the chunked body short.
            _log.error("the handler's streamed content failed after the response began: %s", exc)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response


async def _discard(request: web.BaseRequest, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of the request's body."""
    taken = 0
    while taken < limit and (chunk := await request.content.readany()):
        taken += len(chunk)


def _health_response(ready: bool) -> web.Response:
    if ready:
        return web.Response(body=_HEALTHY, headers={"Content-Type": _JSON})
    return _error_response(503, "service unavailable")


class ControlServer:
    """The health-check port, served by the supervisor whatever any worker does.

    ``/health_check`` is readiness (200 while a worker is ready to take requests, 503 while none
    is, and from the start of a shutdown), ``/livez`` is liveness (200 while the supervisor
    answers), ``/metrics`` the Prometheus scrape of all workers.
    """

    def __init__(self, is_ready: Callable[[], bool], render_metrics: Callable[[], bytes]) -> None:
        self._is_ready = is_ready
        self._render_metrics = render_metrics

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == HEALTH_PATH:
            return _health_response(self._is_ready())
        if path == LIVENESS_PATH:
            return web.Response(body=_HEALTHY, headers={"Content-Type": _JSON})
        if path == METRICS_PATH:
            return web.Response(
                body=self._render_metrics(), headers={"Content-Type": METRICS_CONTENT_TYPE}
            )
        return _error_response(
            404,
            f"not found: this port serves only {HEALTH_PATH}, {LIVENESS_PATH} and {METRICS_PATH}",
        )


async def answer_unavailable(request: web.BaseRequest) -> web.StreamResponse:
    """The service port while no worker is ready: every request gets 503, as on the anchor."""
    response = _error_response(503, "service unavailable")
    response.force_close()
    return response


def _call_and_encode(func: Any, request: Request, context: Any, encode: Any) -> EncodedResponse:
    """Runs on the handler thread: the call and the (possibly CPU-heavy) encoding together."""
    encoded: EncodedResponse = encode(func(request, context))
    return encoded


class _RequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler with two things it does not do itself.

    * Malformed HTTP (header floods, bad request lines) is answered as ``{"status": ...}`` JSON,
      as the contract wants every error, instead of aiohttp's text/plain.
    * A request head must arrive whole within ``head_timeout`` of its first byte (or of the
      connection, for the first request): a client trickling its request line and headers
      (slowloris) is answered ``408`` and cut off. aiohttp's keep-alive timer covers idle
      connections, but not one that keeps sending a byte now and then.
    """

    def __init__(self, manager: web.Server, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages or self._current_request is not None:
            self._disarm_head_timer()  # a whole head arrived
        elif data:
            self._head_started = True
            self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self._loop.call_later(self._head_timeout, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_started = False

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._messages or self._current_request is not None or self.transport is None:
            return
        if self._head_started:  # a partial request: it can still be told why
            self.transport.write(_HEAD_TIMEOUT_RESPONSE)
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        response = super().handle_error(request, status, exc, message)
        if status == 500:
            text = "unexpected error occurred"
        else:
            text = f"malformed HTTP request: {message or exc or 'bad request'}"
        error = _error_response(response.status, text)
        error.force_close()
        return error


_HEAD_TIMEOUT_BODY: Final = json.dumps({"status": "request head not received in time"}).encode()
_HEAD_TIMEOUT_RESPONSE: Final = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_HEAD_TIMEOUT_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _HEAD_TIMEOUT_BODY
)


class _Server(web.Server):
    def __init__(self, handler: Any, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._head_timeout = head_timeout

    def __call__(self) -> web_protocol.RequestHandler:
        return _RequestHandler(
            self, loop=self._loop, head_timeout=self._head_timeout, **self._kwargs
        )


def make_web_server(handler: Any, config: Config) -> web.Server:
    """A low-level aiohttp server: no router or middleware on the hot path, JSON parse errors,
    the connection timeouts of ``config``, and no lingering read of a body nobody will use
    (the 413 path reads a bounded amount itself)."""
    return _Server(
        handler,
        access_log=None,
        keepalive_timeout=config.keepalive_timeout,
        head_timeout=config.request_head_timeout,
        lingering_time=0,
    )
