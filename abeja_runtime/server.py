"""The HTTP layer: aiohttp's low-level server, health checks, and the lifecycle's exchanges.

This is the only module that imports aiohttp. A worker's :class:`HttpServer` answers its own
``/health_check`` and hands every other request to the request lifecycle (``lifecycle.py``)
as an :class:`_AiohttpExchange`, which reads the body and writes the lifecycle's replies (from
memory, or streamed chunk by chunk). Malformed HTTP and slow request heads are answered here, in
the same ``{"status": message}`` JSON as every other error.

Two small servers run in the supervisor, not in workers, so that they answer whatever a worker
does: :class:`ControlServer` on the health-check port (readiness, liveness, metrics), and
:func:`answer_unavailable` (through :class:`ServiceFallback`) on the service port while no
worker is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web, web_protocol

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, status_body, status_reply
from abeja_runtime.errors import BodyTimeout
from abeja_runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

if TYPE_CHECKING:  # the supervisor imports this module, and needs none of the lifecycle
    from abeja_runtime.lifecycle import Lifecycle

__all__ = [
    "HEALTH_PATH",
    "LIVENESS_PATH",
    "METRICS_PATH",
    "ControlServer",
    "HttpServer",
    "ServiceFallback",
    "answer_unavailable",
    "make_web_server",
]

_log = logging.getLogger("abeja_runtime")

HEALTH_PATH: Final = "/health_check"
#: Liveness for kubelets: 200 while the supervisor answers at all (readiness is HEALTH_PATH).
LIVENESS_PATH: Final = "/livez"
METRICS_PATH: Final = "/metrics"
#: After an answer given before the body was read (a 413, a 400), how much more of the body is
#: read and thrown away, and for how long: enough for a client still sending to see its answer
#: (and, for a small rest, to keep the connection), far from a whole refused body.
_REFUSED_BODY_READ: Final = 1024 * 1024
_REFUSED_BODY_WAIT: Final = 1.0
#: After the service port failed to accept (out of descriptors), when the fallback tries again.
_ACCEPT_RETRY: Final = 1.0
_HEALTHY: Final = EncodedResponse(200, (("Content-Type", "application/json"),), status_body("ok"))


def _web_response(reply: EncodedResponse) -> web.Response:
    """An in-memory reply as an aiohttp response."""
    assert isinstance(reply.body, bytes), "streamed replies are written by _AiohttpExchange"
    return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


class HttpServer:
    """A worker's service port: its own ``/health_check``, every other path a request."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle

    async def service(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.path == HEALTH_PATH:
            return _health_response(self._lifecycle.ready)
        exchange = _AiohttpExchange(request)
        await self._lifecycle.serve(exchange)
        assert exchange.response is not None, "every path of the lifecycle sends a reply"
        return exchange.response


class _AiohttpExchange:
    """An aiohttp request as the lifecycle's ``Exchange``, and the response sent for it."""

    __slots__ = (
        "_request",
        "content_length",
        "keep_alive",
        "method",
        "path",
        "raw_path",
        "raw_query",
        "response",
    )

    def __init__(self, request: web.BaseRequest) -> None:
        self._request = request
        self.method = request.method
        self.path = request.path
        url = request.rel_url
        self.raw_path = url.raw_path
        self.raw_query = url.raw_query_string
        self.content_length = request.content_length
        self.keep_alive = request.keep_alive
        self.response: web.StreamResponse | None = None

    def header(self, name: str) -> str | None:
        return self._request.headers.get(name)

    def headers(self) -> Iterable[tuple[str, str]]:
        return self._request.headers.items()

    def body(self) -> AsyncIterator[bytes]:
        request = self._request
        if not request.content.is_eof():
            protocol = request.protocol
            assert isinstance(protocol, _RequestHandler)
            protocol.watch_body(request)
        if request.headers.get("Expect", "").lower() == "100-continue":
            return self._continue_then(request.content.iter_any())
        return request.content.iter_any()

    async def _continue_then(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        await self._request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        async for chunk in chunks:
            yield chunk

    async def send(self, reply: EncodedResponse, *, close: bool) -> None:
        body = reply.body
        try:
            if isinstance(body, bytes):
                response = self.response = _web_response(reply)
                if close:
                    response.force_close()
                await response.prepare(self._request)
                await response.write_eof()
            else:
                await self._stream(reply, close)
            if not close and not self._request.content.is_eof():
                # An error answered before the body was read (a bad multipart header, say):
                # take in a small rest so that the connection can serve the next request.
                await self._discard_rest()
        except ConnectionError:
            pass  # the client went away; nothing left to tell it

    async def _discard_rest(self) -> None:
        """Read and drop at most ``_REFUSED_BODY_READ`` more bytes of the body, for at most
        ``_REFUSED_BODY_WAIT`` seconds; aiohttp closes the connection if any is left."""
        # The client may stop, reset, or send a broken chunk: all mean "done" here.
        with contextlib.suppress(
            asyncio.TimeoutError, ConnectionError, web_protocol.RequestPayloadError
        ):
            await asyncio.wait_for(_discard(self._request, _REFUSED_BODY_READ), _REFUSED_BODY_WAIT)

    async def _stream(self, reply: EncodedResponse, close: bool) -> None:
        chunks = reply.body
        assert isinstance(chunks, AsyncIterator), "the lifecycle streams through the loop"
        response = self.response = web.StreamResponse(status=reply.status, headers=reply.headers)
        if close:
            response.force_close()
        response.enable_chunked_encoding()
        await response.prepare(self._request)
        try:
            async for chunk in chunks:
                await response.write(chunk)
        except ConnectionError:
            raise
        except Exception as exc:
            # Headers are out: the only honest signal left is to cut the chunked body short.
            _log.error("the handler's streamed content failed after the response began: %s", exc)
            if self._request.transport is not None:
                self._request.transport.close()
            return
        await response.write_eof()

    async def refuse(self, reply: EncodedResponse) -> None:
        """Answer now and stop taking in a body we refused (413).

        The answer goes out first; then at most ``_REFUSED_BODY_READ`` more bytes are read, for
        at most ``_REFUSED_BODY_WAIT`` seconds, so that a client still sending sees its answer
        rather than a reset; then the connection is closed.
        """
        request = self._request
        response = self.response = _web_response(reply)
        response.force_close()
        with contextlib.suppress(ConnectionError):
            await response.prepare(request)
            await response.write_eof()
            if request.content.exception() is None:  # a stalled body: nothing more to read
                await self._discard_rest()
        request.protocol.force_close()


async def _discard(request: web.BaseRequest, limit: int) -> None:
    """Read and drop up to ``limit`` bytes of the request's body."""
    taken = 0
    while taken < limit and (chunk := await request.content.readany()):
        taken += len(chunk)


def _health_response(ready: bool) -> web.Response:
    return _web_response(_HEALTHY if ready else status_reply(503, "service unavailable"))


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
            return _web_response(_HEALTHY)
        if path == METRICS_PATH:
            return web.Response(
                body=self._render_metrics(), headers={"Content-Type": METRICS_CONTENT_TYPE}
            )
        return _web_response(
            status_reply(
                404,
                f"not found: this port serves only {HEALTH_PATH}, {LIVENESS_PATH} and "
                f"{METRICS_PATH}",
            )
        )


class ServiceFallback:
    """The supervisor's answers on the shared service socket while no worker is ready.

    It accepts on a duplicate of the socket (closing it stops only the supervisor's accepting)
    by hand, not through ``loop.create_server``: asyncio's ``Server.close()`` called while a
    connection it has just accepted still waits for its transport (created one loop iteration
    later) drops that connection without closing or answering it (CPython 3.11 swallows the
    failed ``Server._attach`` assertion), so its client waited, unanswered, for as long as it
    was willing to. That happened when a worker became ready while a request arrived: a CLI
    request hung after "sending request to model". Here every accepted connection is served.
    """

    def __init__(
        self, protocol_factory: Callable[[], asyncio.Protocol], service_socket: socket.socket
    ) -> None:
        self._protocol_factory = protocol_factory
        self._service_socket = service_socket
        self._listener: socket.socket | None = None
        #: Connections being set up (the loop keeps tasks only weakly).
        self._connecting: set[asyncio.Task[Any]] = set()

    @property
    def active(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        if self._listener is not None:
            return
        listener = socket.socket(fileno=os.dup(self._service_socket.fileno()))
        listener.setblocking(False)
        asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)
        self._listener = listener

    def stop(self) -> None:
        """Stop accepting at once; connections already accepted are still answered."""
        listener, self._listener = self._listener, None
        if listener is not None:
            asyncio.get_running_loop().remove_reader(listener.fileno())
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: the connection waits in the queue
                _log.warning("the service port could not accept a connection: %s", exc)
                loop.remove_reader(listener.fileno())
                loop.call_later(_ACCEPT_RETRY, self._resume, listener)
                return
            connection.setblocking(False)
            task = loop.create_task(
                loop.connect_accepted_socket(self._protocol_factory, connection)
            )
            self._connecting.add(task)
            task.add_done_callback(self._connected)

    def _resume(self, listener: socket.socket) -> None:
        if self._listener is listener:
            asyncio.get_running_loop().add_reader(listener.fileno(), self._accept, listener)

    def _connected(self, task: asyncio.Task[Any]) -> None:
        self._connecting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.debug("a connection to the service port failed: %s", task.exception())


async def answer_unavailable(request: web.BaseRequest) -> web.StreamResponse:
    """The service port while no worker is ready: every request gets 503, as on the anchor."""
    response = _web_response(status_reply(503, "service unavailable"))
    response.force_close()
    return response


class _RequestHandler(web_protocol.RequestHandler):
    """aiohttp's connection handler with two things it does not do itself.

    * Malformed HTTP (header floods, bad request lines) is answered as ``{"status": ...}`` JSON,
      as the contract wants every error, instead of aiohttp's text/plain.
    * A request head must arrive whole within ``head_timeout`` of its first byte (or of the
      connection, for the first request): a client trickling its request line and headers
      (slowloris) is answered ``408`` and cut off. aiohttp's keep-alive timer covers idle
      connections, but not one that keeps sending a byte now and then.
    * A body being read must make progress: no byte for ``head_timeout`` seconds fails its
      reading with :class:`BodyTimeout` (``408``, the connection closed), where aiohttp would
      wait for ever.
    """

    def __init__(self, manager: web.Server, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False
        #: When bytes last arrived, and the watch over a body being read (see watch_body).
        self._last_data = 0.0
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        super().data_received(data)
        if self._messages or self._current_request is not None:
            self._disarm_head_timer()  # a whole head arrived
        elif data:
            self._head_started = True
            self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm_head_timer()
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().connection_lost(exc)

    @property
    def fresh(self) -> bool:
        """Accepted, and not a byte received yet: a request is on its way (or the client
        will be cut off at ``head_timeout``)."""
        return self._last_data == 0.0

    def watch_body(self, request: web.BaseRequest) -> None:
        """Fail the reading of ``request``'s body if no byte arrives for ``head_timeout``.

        One timer per body still arriving, which looks at when bytes last came (a float that
        ``data_received`` sets) rather than being reset for every packet.
        """
        self._last_data = self._loop.time()
        if self._body_timer is None:
            self._body_timer = self._loop.call_later(self._head_timeout, self._check_body, request)

    def _check_body(self, request: web.BaseRequest) -> None:
        self._body_timer = None
        content = request.content
        if content.is_eof() or content.exception() is not None:
            return
        idle = self._loop.time() - self._last_data
        if idle >= self._head_timeout:
            content.set_exception(BodyTimeout(self._head_timeout))
        else:
            self._body_timer = self._loop.call_later(
                self._head_timeout - idle, self._check_body, request
            )

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
        error = _web_response(status_reply(response.status, text))
        error.force_close()
        return error


_HEAD_TIMEOUT_BODY: Final = status_body("request head not received in time")
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
