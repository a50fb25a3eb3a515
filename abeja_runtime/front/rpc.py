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
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import time
from typing import Any, Final

import grpc

from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError, HandlerTimeout, HttpError, ServiceBusy
from abeja_runtime.frames import INLINE_LIMIT, RpcAnswer, RpcCall
from abeja_runtime.front.calls import CallService
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.logs import REQUEST_ID_HEADER, request_id_from

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


class RpcServer:
    """The front's gRPC server over the handler pool."""

    def __init__(self, config: Config, calls: CallService, methods: tuple[str, ...]) -> None:
        assert config.grpc_port is not None
        self._calls = calls
        self._trim: asyncio.TimerHandle | None = None
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", config.max_body_size or -1),
                ("grpc.max_send_message_length", -1),
            ]
        )
        services: dict[str, dict[str, Any]] = {}
        for method in methods:  # "/package.Service/Method"
            service, name = method.lstrip("/").split("/", 1)
            forward: Any = grpc.unary_unary_rpc_method_handler(self._forwarder(method))
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
        async def forward(payload: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await self._forward(method, payload, context)

        return forward

    async def _forward(
        self, method: str, payload: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        received = time.time()
        metadata = tuple(
            (key, value)
            for key, value in (context.invocation_metadata() or ())
            if isinstance(value, str)
        )
        request_id = request_id_from(dict(metadata).get(REQUEST_ID_HEADER))
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
        calls = self._calls
        # Ended however the call ends: a call the client cancels (or whose own deadline
        # passes) is counted as 499 then.
        entry = calls.accounting.open("POST", method, received, request_id)
        try:
            if not calls.admitting:
                code, message, status = grpc.StatusCode.UNAVAILABLE, "service unavailable", 503
            else:
                try:
                    pending = await self._pending(method, payload, metadata, request_id)
                    answer = await calls.call(pending, received)
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
            if len(payload) > INLINE_LIMIT:
                self._trim_soon()
        await context.abort(code, message)
        raise AssertionError("abort raises")  # pragma: no cover

    def _trim_soon(self) -> None:
        """Give the memory of big messages back to the system once the burst is over.

        grpcio receives and sends a message in pieces from the heap, which the front keeps
        (it keeps freed memory for its next requests: ``supervisor._keep_freed_memory``):
        twenty 50 MiB Seldon calls left the front 650-850 MiB larger for good. ``malloc_trim``
        returns the free pages, a second after the last big call."""
        if self._trim is not None:
            self._trim.cancel()
        self._trim = self._calls.loop.call_later(_TRIM_AFTER, _trim_heap)

    async def _pending(
        self,
        method: str,
        payload: bytes,
        metadata: tuple[tuple[str, str], ...],
        request_id: str,
    ) -> PendingCall:
        """The call of a message: in the frame up to the inline limit; above it, in a shared
        buffer that takes a place as an HTTP body does (waiting for one counts as waiting in
        the queue: ``RESOURCE_EXHAUSTED`` when the queue could not take it, and
        ``DEADLINE_EXCEEDED`` at the deadline)."""
        calls = self._calls
        size = len(payload)
        if size <= INLINE_LIMIT:
            call = RpcCall(calls.next_id(), method, payload, metadata, request_id)
            return PendingCall(call, calls.loop)
        await calls.enter_gate()
        body, mapped = calls.held_body(size)
        mapped[:size] = payload
        call = RpcCall(calls.next_id(), method, b"", metadata, request_id, size)
        return PendingCall(call, calls.loop, body.fd, body.close)
