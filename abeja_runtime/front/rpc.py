"""The front's gRPC port: each call's method and message bytes, forwarded to a handler process.

KServe's Open Inference (V2) protocol and Seldon Core's services have a gRPC form next to REST.
When ``--grpc-port`` is set, the front starts this ``grpc.aio`` server once the first handler
process has said which methods its style serves. The front never parses a message: each call
becomes a :class:`~abeja_runtime.frames.RpcCall` through the same pool as HTTP requests
(``503`` ↔ ``RESOURCE_EXHAUSTED`` beyond the queue, ``DEADLINE_EXCEEDED`` at the timeout,
``UNAVAILABLE`` while no handler process is ready), and the handler process's style answers
it (``styles/kserve/grpc_service.py``, ``styles/seldon/grpc_service.py``). Each call is counted
in the access log and the metrics as ``POST /package.Service/Method`` with the HTTP status that
corresponds to its gRPC status, and waited for at shutdown. The request id travels as
``x-abeja-request-id`` metadata, both ways. grpcio is imported only when the port is asked for.

**Memory.** grpcio's server reads a unary call's whole message (into its own buffers, then as
``bytes``) before the method's coroutine runs, and it matches every call that comes at once:
its ``maximum_concurrent_rpcs`` refuses calls beyond it (``RESOURCE_EXHAUSTED``), it does not
make them wait. Twenty concurrent 50 MiB Seldon ``Predict`` calls took the front to 1.7-2.1 GB,
while the body places bounded only what was forwarded. So each method is served as
client-streaming (the same on the wire), and a call takes a body place (``calls.enter_gate``)
before it reads its message with ``context.read()``; a message up to the inline limit gives the
place back at once, a bigger one keeps it until its answer is sent. A call waiting for a place
leaves its message in its client: HTTP/2 flow control lets 64 KiB of it come, no more, as long
as BDP probing does not widen the window (it is turned off: it grew the windows of waiting
calls until they were read anyway, 1.2-1.35 GB). grpcio holds about 80 KiB of such a call
(measured: a thousand calls waiting, 83 MiB).

A message being read costs three copies at once: grpcio's buffers, the ``bytearray`` it joins
them in and the ``bytes`` made of that (measured: 150 MiB for 50 MiB). The places alone let
every place's message be read at once, and the calls of one client come on one connection
(grpcio's channels in a process share one per address): the twenty calls' five messages with a
place came interleaved and were read together, to a peak of 0.54-0.66 GB, 1,010 MiB on another
machine. So a connection's messages are read one at a time (:class:`_ConnectionTurns`), the
next once the last is in its buffer; the others wait with their place, unread. Connections are
not made to wait for each other: a client that stalls holds up its own calls only. The front
then holds at most, besides its base (50-80 MiB), two copies of each message a place holds (the
shared buffer and ``bytes`` while it is copied there, the answer's ``bytes`` and grpcio's copy
while it is sent), three of each message being read (one per connection) and 80 KiB per
waiting call: with one process (1 + 4 places) and one connection, 0.42-0.56 GB for the twenty
calls; ``tests/test_grpc_memory.py`` checks ``base + places x 2 x size + 3 x size``. The largest
message is ``--max-body-size``. A small message's answer takes no place: a big answer to a
small message is not bounded here, as on the HTTP port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc

from abeja_runtime.config import Config
from abeja_runtime.errors import (
    BadRequest,
    HandlerLoadError,
    HandlerTimeout,
    HttpError,
    ServiceBusy,
)
from abeja_runtime.frames import INLINE_LIMIT, RpcAnswer, RpcCall
from abeja_runtime.front.accounting import CallEntry
from abeja_runtime.front.calls import CallService
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.logs import REQUEST_ID_HEADER, request_id_from
from abeja_runtime.tracing import carrier

__all__ = ["RpcServer"]

#: grpc's stop(grace=None) cancels running calls at once; a grace period of 0 means no limit.
_NO_LIMIT: Final = 365 * 24 * 3600.0
_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}


#: Seconds after the last big message before the heap is trimmed.
_TRIM_AFTER: Final = 1.0


def _trim_heap() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL(None).malloc_trim(0)


def _status_of(exc: HttpError) -> grpc.StatusCode:
    """The front's own refusals, as gRPC says them."""
    if isinstance(exc, ServiceBusy):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, HandlerTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if exc.status == 503:
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class _ConnectionTurns:
    """Each connection's messages received one at a time (see the module): the others of the
    connection wait their turn, unread in their client."""

    def __init__(self) -> None:
        self._turns: dict[str, asyncio.Lock] = {}
        self._calls: collections.Counter[str] = collections.Counter()

    @contextlib.asynccontextmanager
    async def turn(self, connection: str) -> AsyncIterator[None]:
        """Held while a message of ``connection`` (its peer address) is received."""
        turn = self._turns.get(connection)
        if turn is None:
            turn = self._turns[connection] = asyncio.Lock()
        self._calls[connection] += 1
        try:
            async with turn:
                yield
        finally:
            self._calls[connection] -= 1
            if not self._calls[connection]:
                del self._calls[connection], self._turns[connection]


class RpcServer:
    """The front's gRPC server over the handler pool."""

    def __init__(self, config: Config, calls: CallService, methods: tuple[str, ...]) -> None:
        assert config.grpc_port is not None
        self._calls = calls
        self._receiving = _ConnectionTurns()
        self._trim: asyncio.TimerHandle | None = None
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_body_size or -1),
                ("grpc.max_send_message_length", -1),
                # A call waiting for its place is left unread in a window of HTTP/2's 64 KiB,
                # which BDP probing would widen (see the module). A message being read is
                # asked for whole, its window opened to its size (measured: as fast as before).
                ("grpc.http2.bdp_probe", 0),
            ]
        )
        services: dict[str, dict[str, Any]] = {}
        for method in methods:  # "/package.Service/Method"
            service, name = method.lstrip("/").split("/", 1)
            # Served as client-streaming (the same on the wire as a unary call) so that the
            # message is read only when ``_forward`` asks for it: see the module.
            forward: Any = grpc.stream_unary_rpc_method_handler(self._forwarder(method))
            services.setdefault(service, {})[name] = forward
        self._server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(name, calls) for name, calls in services.items()]
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

    def _forwarder(self, method: str) -> Any:
        async def forward(_: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await self._forward(method, context)

        return forward

    async def _forward(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        received = time.time()
        metadata = tuple(
            (key, value)
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)
        )
        given = dict(metadata)  # also the caller's trace context
        request_id = request_id_from(given.get(REQUEST_ID_HEADER))
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
        calls = self._calls
        # Ended however the call ends: a call the client cancels (or whose own deadline
        # passes) is counted as 499 then.
        entry = calls.accounting.open("POST", method, received, request_id, None, given, rpc=True)
        size = 0
        try:
            if not calls.admitting:
                code, message, status = grpc.StatusCode.UNAVAILABLE, "service unavailable", 503
            else:
                try:
                    pending, size = await self._pending(method, metadata, entry, context)
                    answer = await calls.call(pending, received, entry)
                except HttpError as exc:
                    calls.refusal(exc)  # counted as on the HTTP port
                    code, message, status = _status_of(exc), exc.message, exc.status
                else:
                    assert isinstance(answer, RpcAnswer)
                    if answer.code == 0:
                        entry.count(200)
                        return answer.payload
                    code, message, status = _CODES[answer.code], answer.message, answer.http_status
            entry.count(status)
        finally:
            entry.end()
            if size > INLINE_LIMIT:
                self._trim_soon()
        await context.abort(code, message)
        raise AssertionError("abort raises")  # pragma: no cover

    def _trim_soon(self) -> None:
        """Give the memory of big messages back to the system once the burst is over.

        grpcio receives and sends a message in pieces from the heap, which the front keeps
        (it keeps freed memory for its next requests: ``supervisor._keep_freed_memory``):
        before the body places bounded what grpcio reads, twenty 50 MiB Seldon calls left the
        front 650-850 MiB larger for good; bounded, up to its peak (see the module).
        ``malloc_trim`` returns the free pages, a second after the last big call."""
        if self._trim is not None:
            self._trim.cancel()
        self._trim = self._calls.loop.call_later(_TRIM_AFTER, _trim_heap)

    async def _pending(
        self,
        method: str,
        metadata: tuple[tuple[str, str], ...],
        entry: CallEntry,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> tuple[PendingCall, int]:
        """The call of the message, read once it has a body's place (its size is not known
        before: see the module) and its connection's turn, and the message's size. Waiting for
        the place counts as waiting in the queue: ``RESOURCE_EXHAUSTED`` when the queue could
        not take the call, ``DEADLINE_EXCEEDED`` at the deadline; a client that leaves
        meanwhile (or whose own deadline passes) cancels the wait. Up to the inline limit the
        message travels in the frame and the place is given back at once; above it, in a
        shared buffer, and the place is kept until the call's answer is sent or the call ends
        otherwise."""
        calls = self._calls
        await calls.enter_gate()
        try:
            # The next message of the connection is read once this one is in its buffer: no
            # await comes between the read and the copy below.
            async with self._receiving.turn(context.peer()):
                payload = await context.read()
        except BaseException:  # too big, or the client left
            calls.gate.leave()
            raise
        if payload is grpc.aio.EOF:  # a client that half-closed without its one message
            calls.gate.leave()
            raise BadRequest("the call sent no request message")
        size = len(payload)
        if size <= INLINE_LIMIT:
            calls.gate.leave()
            call = RpcCall(
                calls.next_id(),
                method,
                payload,
                metadata,
                entry.request_id,
                0,
                carrier(entry.trace),
            )
            return PendingCall(call, calls.loop, trace=entry.trace), size
        body, mapped = calls.held_body(size)
        # Kept until grpcio is done with the call (its answer sent, or the client gone), not
        # only until the answer comes: grpcio holds the answer twice until then. The buffer
        # alone is given back when the answer comes, as an HTTP body's.
        body.gate = None
        # grpc-stubs types the callback as a class of its own, which no function is
        context.add_done_callback(lambda _: calls.gate.leave())  # type: ignore[arg-type]
        mapped[:size] = payload
        del payload  # the front holds the message once, in the buffer, while the call runs
        call = RpcCall(
            calls.next_id(), method, b"", metadata, entry.request_id, size, carrier(entry.trace)
        )
        return PendingCall(call, calls.loop, body.fd, body.close, entry.trace), size
