"""What the loader hands the server: the user's handler, already adapted to ABEJA's signature.

A module of its own so that the loader and the style adapters (which produce it) and the
server (which calls it) all depend on it, and on nothing of each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["LoadedHandler", "RpcRunner", "RpcService"]


class RpcRunner(Protocol):
    """How a style's gRPC method runs what reaches the user's code (``rpc.RpcServer.run``).

    ``work`` runs on the handler thread, or is awaited on the loop when ``is_async``; with
    ``admitted=False`` it is awaited at once (answers that touch no user code). ``errors``
    turns an exception of the style into its gRPC status code and message.
    """

    def __call__(
        self,
        context: Any,
        method: str,
        work: Callable[[], Any],
        *,
        is_async: bool,
        errors: Callable[[Exception], tuple[Any, str]],
        admitted: bool = True,
    ) -> Awaitable[Any]: ...


class RpcService(Protocol):
    """A style's gRPC services (KServe's Open Inference protocol), which the worker's gRPC
    server registers on itself when ``--grpc-port`` is set."""

    def register(self, server: Any, run: RpcRunner) -> None: ...


@dataclass(frozen=True)
class LoadedHandler:
    """The handler, and whether it must be awaited (decided once, at load time).

    ``func`` is always an ABEJA-style ``handler(request, context)``: handlers of other styles
    arrive here wrapped by their adapter, and ``style`` says which one.
    """

    func: Any
    is_async: bool
    name: str
    style: str = "abeja"
    #: The style's gRPC services; None for styles that have no gRPC protocol.
    rpc: RpcService | None = None
    #: The style's teardown, called once at shutdown after the last request (KServe's
    #: ``Model.stop()``, which its ModelServer calls as it stops).
    stop: Callable[[], object] | None = None
