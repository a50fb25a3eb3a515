"""The front's gRPC port: each call's method and message bytes, forwarded to a handler process.

KServe's Open Inference (V2) protocol and Seldon Core's services have a gRPC form next to REST.
When ``--grpc-port`` is set, the front starts this ``grpc.aio`` server once the first handler
process has said which methods its style serves. The front never parses a message: each call
is a call like any other (``call.py``, ``503`` ↔ ``RESOURCE_EXHAUSTED`` beyond the queue,
``DEADLINE_EXCEEDED`` at the timeout, ``UNAVAILABLE`` while no handler process is ready), its
frame a :class:`~abeja_runtime.frames.RpcCall`, answered by the handler process's style
(``styles/kserve/grpc_service.py``, ``styles/seldon/grpc_service.py``). Each call is counted in
the access log and the metrics as ``POST /package.Service/Method`` with the HTTP status that
corresponds to its gRPC status. The request id travels as ``x-abeja-request-id`` metadata, both
ways. grpcio is imported only when the port is asked for.

**Memory.** grpcio reads a unary call's whole message before the method runs, for every call
that comes at once. So each method is served as client-streaming (the same on the wire), and a
call takes a body place (``BodyPlaces.enter``) before it reads its message; a waiting call
leaves its message in its client (HTTP/2 flow control lets 64 KiB of it come; BDP probing, which
would widen the window, is off). A message up to the inline limit gives the place back at once;
a bigger one keeps it until grpcio is done with the call. A message being read is held three
times (grpcio's buffers, the ``bytearray`` it joins them in, the ``bytes`` made of that), so a
connection's messages are read one at a time (:class:`_ConnectionTurns`); connections do not
wait for each other. The front then holds at most, besides its base, two copies of each message
a place holds, three of each message being read (one per connection) and about 80 KiB per
waiting call (``tests/test_grpc_memory.py`` checks it). A small message's answer takes no
place: a big answer to a small message is not bounded here, as on the HTTP port.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import time
import weakref
from functools import partial
from typing import Any, Final

import grpc

from abeja_runtime.config import Config
from abeja_runtime.errors import (
    BadRequest,
    HandlerLoadError,
    HandlerTimeout,
    HttpError,
    ServiceBusy,
    Unauthorized,
)
from abeja_runtime.frames import INLINE_LIMIT, RpcAnswer, RpcCall
from abeja_runtime.front.body import IN_FRAME, Body
from abeja_runtime.front.call import AwaitedAnswer, FrontCall
from abeja_runtime.front.service import CallHead, CallService
from abeja_runtime.logs import REQUEST_ID_HEADER, request_id_from
from abeja_runtime.tracing import carrier

__all__ = ["RpcServer"]

#: grpc's stop(grace=None) cancels running calls at once; a grace period of 0 means no limit.
_NO_LIMIT: Final = 365 * 24 * 3600.0
_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}
#: Seconds after the last big message before the heap is trimmed.
_TRIM_AFTER: Final = 1.0
#: The metadata that carries an API key (``api_keys.py``), kept from the style with keys on.
_CREDENTIALS: Final = ("authorization", "x-api-key")


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL(None).malloc_trim(0)


def _status_of(exc: HttpError) -> grpc.StatusCode:
    """The front's own refusals, as gRPC says them."""
    if isinstance(exc, ServiceBusy):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, HandlerTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, Unauthorized):
        return grpc.StatusCode.UNAUTHENTICATED
    if exc.status == 503:
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class _ConnectionTurns:
    """Each connection's messages received one at a time (see the module): the others of the
    connection wait their turn, unread in their client. A connection's lock is kept while a
    call holds it or waits for it, and no longer."""

    def __init__(self) -> None:
        self._turns: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def turn(self, connection: str) -> asyncio.Lock:
        """Held while a message of ``connection`` (its peer address) is received."""
        turn = self._turns.get(connection)
        if turn is None:
            turn = self._turns[connection] = asyncio.Lock()
        return turn


class RpcServer:
    """The front's gRPC server over the handler pool."""

    def __init__(self, config: Config, service: CallService, methods: tuple[str, ...]) -> None:
        assert config.grpc_port is not None
        self._service = service
        self._receiving = _ConnectionTurns()
        self._trim: asyncio.TimerHandle | None = None
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_body_size or -1),
                ("grpc.max_send_message_length", -1),
                # A call waiting for its place is left unread in a window of HTTP/2's 64 KiB,
                # which BDP probing would widen (see the module). A message being read is
                # asked for whole, its window opened to its size.
                ("grpc.http2.bdp_probe", 0),
            ]
        )
        services: dict[str, dict[str, Any]] = {}
        for method in methods:  # "/package.Service/Method"
            service_name, name = method.lstrip("/").split("/", 1)
            # Served as client-streaming (the same on the wire as a unary call) so that the
            # message is read only when ``_forward`` asks for it: see the module.
            forward: Any = grpc.stream_unary_rpc_method_handler(partial(self._forward, method))
            services.setdefault(service_name, {})[name] = forward
        self._server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(name, forwards)
                for name, forwards in services.items()
            ]
        )
        host = f"[{config.host}]" if ":" in config.host else config.host
        try:
            self._server.add_insecure_port(f"{host}:{config.grpc_port}")
        except RuntimeError as exc:  # checked at start, but it may be taken since
            raise HandlerLoadError(
                f"cannot listen for gRPC on {config.host}:{config.grpc_port} ({exc}); another "
                "program may use the port: choose another with --grpc-port"
            ) from None

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """New calls are refused at once; running ones get ``grace`` seconds (0: no limit)."""
        await self._server.stop(grace if grace > 0 else _NO_LIMIT)

    async def _forward(
        self, method: str, _: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        received = time.time()
        sent = tuple(
            (key, value)
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)
        )
        given = dict(sent)  # also the caller's trace context
        # What the style sees of it: never the caller's credentials, with API keys on.
        credentials = () if self._service.keys is None else _CREDENTIALS
        metadata = tuple((key, value) for key, value in sent if key not in credentials)
        request_id = request_id_from(given.get(REQUEST_ID_HEADER))
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
        service = self._service
        responder = AwaitedAnswer(service.loop)
        remaining = context.time_remaining()  # the caller's deadline (grpc-timeout), if any
        budget = None if remaining is None or remaining > _NO_LIMIT else max(1e-6, remaining)
        head = CallHead("POST", method, received, request_id, None, given, True, budget)
        call = service.begin(head, responder)
        try:
            try:
                call.admit(given)
                frame, body = await self._message(method, metadata, call, context)
            except HttpError as exc:
                call.refuse(exc)
            else:
                call.submit(frame, body)
            try:
                result = await responder.result
            except asyncio.CancelledError:  # the client left, or its own deadline passed
                call.client_left()
                raise
            if isinstance(result, HttpError):
                code, message, status = _status_of(result), result.message, result.status
            elif not isinstance(result, RpcAnswer):
                raise AssertionError("a gRPC call is answered by an RpcAnswer")
            elif result.code == 0:
                call.entry.count(200)
                return result.payload
            else:
                code, message, status = _CODES[result.code], result.message, result.http_status
            call.entry.count(status)
        finally:
            call.finish()
            if call.body is not None and call.body.size > INLINE_LIMIT:
                self._trim_soon()
        await context.abort(code, message)
        raise AssertionError("abort raises")  # pragma: no cover

    def _trim_soon(self) -> None:
        """Give the memory of big messages back to the system once the burst is over: grpcio
        receives and sends a message in pieces from the heap, which the front keeps
        (``supervisor._keep_freed_memory``); ``malloc_trim`` returns the free pages, a second
        after the last big call."""
        if self._trim is not None:
            self._trim.cancel()
        self._trim = self._service.loop.call_later(_TRIM_AFTER, _trim_heap)

    async def _message(
        self,
        method: str,
        metadata: tuple[tuple[str, str], ...],
        call: FrontCall,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> tuple[RpcCall, Body]:
        """The call's frame and body, read once it has a body's place and its connection's
        turn (see the module); the wait for the place is the queue's wait (``503`` when the
        queue could not take the call, ``504`` at the deadline). A message up to the inline
        limit travels in the frame, its place given back at once; a bigger one in a shared
        buffer, its place kept until grpcio is done with the call (it holds the answer twice
        until then)."""
        service = self._service
        gate = service.bodies.gate
        await service.bodies.enter(call.deadline, call.caller_budget)
        try:
            # The next message of the connection is read once this one is in its buffer: no
            # await comes between the read and the copy below.
            async with self._receiving.turn(context.peer()):
                payload = await context.read()
        except BaseException:  # too big, or the client left
            gate.leave()
            raise
        if payload is grpc.aio.EOF:  # a client that half-closed without its one message
            gate.leave()
            raise BadRequest("the call sent no request message")
        body = IN_FRAME
        if len(payload) <= INLINE_LIMIT:
            gate.leave()
        else:
            body, mapped = service.bodies.held(len(payload))
            body.gate = None  # left when grpcio is done with the call
            # grpc-stubs types the callback as a class of its own, which no function is
            context.add_done_callback(lambda _: gate.leave())  # type: ignore[arg-type]
            mapped[: body.size] = payload
            payload = b""  # the front holds the message once, in the buffer, while the call runs
        entry = call.entry
        trace, start_by = carrier(entry.trace), call.start_by()
        frame = RpcCall(
            call.id, method, payload, metadata, entry.request_id, body.size, trace, start_by
        )
        return frame, body
