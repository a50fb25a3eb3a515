"""The gRPC port: a ``grpc.aio`` server on a worker's event loop, for styles that speak gRPC.

KServe's Open Inference (V2) protocol has a gRPC form next to REST. When ``--grpc-port`` is
set, each worker starts this server once its handler is loaded and binds the port with
``SO_REUSEPORT`` (as the service port is shared), so the kernel spreads connections over the
workers; a gRPC channel is one connection and stays with one worker. Before a worker is
ready, no worker listens and a client's channel waits and retries, as gRPC channels do.

The style registers its services (``handler.RpcService``); each method hands what reaches the
user's code to :meth:`RpcServer.run`, which takes it through the request lifecycle like an
HTTP request: refused while unavailable, admitted (``RESOURCE_EXHAUSTED`` beyond the queue),
called within the deadline (``DEADLINE_EXCEEDED``), counted in the access log and the metrics
as ``POST /package.Service/Method`` with the HTTP status that corresponds to its gRPC status,
and waited for at shutdown. The request id travels as ``x-abeja-request-id`` metadata, both
ways. grpcio is imported only when the port is asked for.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, Final

import grpc

from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError, HandlerTimeout, HttpError, ServiceBusy
from abeja_runtime.handler import RpcService
from abeja_runtime.lifecycle import REQUEST_ID_HEADER, Lifecycle
from abeja_runtime.logs import request_id_var

__all__ = ["RpcServer"]

#: The HTTP status the access log and the metrics count for a gRPC status (the mapping of
#: gRPC's own HTTP gateway, with CANCELLED as the 499 of a client that left).
_HTTP_STATUS: Final = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,  # "service busy" on the HTTP port
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
#: grpc's stop(grace=None) cancels running calls at once; a grace period of 0 means no limit.
_NO_LIMIT: Final = 365 * 24 * 3600.0


def _status_of(exc: HttpError) -> grpc.StatusCode:
    """The runtime's own refusals, as gRPC says them."""
    if isinstance(exc, ServiceBusy):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, HandlerTimeout):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if exc.status == 503:
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


class RpcServer:
    """One worker's gRPC server over its :class:`Lifecycle`."""

    def __init__(self, lifecycle: Lifecycle, config: Config, service: RpcService) -> None:
        assert config.grpc_port is not None
        self._lifecycle = lifecycle
        self._server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 1),
                ("grpc.max_receive_message_length", config.max_body_size or -1),
                ("grpc.max_send_message_length", -1),
            ]
        )
        service.register(self._server, self.run)
        host = f"[{config.host}]" if ":" in config.host else config.host
        try:
            self._server.add_insecure_port(f"{host}:{config.grpc_port}")
        except RuntimeError as exc:  # the supervisor checked the port, but it may be taken since
            raise HandlerLoadError(
                f"cannot listen for gRPC on {config.host}:{config.grpc_port} ({exc}); another "
                "program may use the port: choose another with --grpc-port"
            ) from None

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace: float) -> None:
        """New calls are refused at once; running ones get ``grace`` seconds (0: no limit)."""
        await self._server.stop(grace if grace > 0 else _NO_LIMIT)

    async def run(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        method: str,
        work: Callable[[], Any],
        *,
        is_async: bool,
        errors: Callable[[Exception], tuple[grpc.StatusCode, str]],
        admitted: bool = True,
    ) -> Any:
        """Run one call of ``method`` (the full name, ``/package.Service/Method``); see
        :class:`abeja_runtime.handler.RpcRunner`."""
        received = time.time()
        metadata = dict(context.invocation_metadata() or ())
        request_id = str(metadata.get(REQUEST_ID_HEADER) or os.urandom(16).hex())
        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))
        token = request_id_var.set(request_id)
        try:
            try:
                if admitted:
                    value = await self._lifecycle.run_call(work, is_async=is_async)
                else:
                    value = await work()
            except HttpError as exc:
                code, message, status = _status_of(exc), exc.message, exc.status
            except asyncio.CancelledError:  # the client left, or its own deadline passed
                self._lifecycle.account("POST", method, 499, received)
                raise
            except Exception as exc:
                code, message = errors(exc)
                status = _HTTP_STATUS.get(code, 500)
            else:
                self._lifecycle.account("POST", method, 200, received)
                return value
            self._lifecycle.account("POST", method, status, received)
        finally:
            request_id_var.reset(token)
        await context.abort(code, message)
