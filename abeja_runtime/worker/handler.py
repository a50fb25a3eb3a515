"""What the loader hands the handler process: the user's handler, adapted to ABEJA's signature.

A module of its own so that the loader and the style adapters (which produce it) and the
handler process (which calls it) all depend on it, and on nothing of each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["LoadedHandler", "RpcResult", "RpcService"]


#: What a gRPC call gives back: the gRPC status code's value (0: OK), the response message's
#: bytes, the error message, and the HTTP status the access log counts for it.
RpcResult = tuple[int, bytes, str, int]


class RpcService(Protocol):
    """A style's gRPC services (KServe's Open Inference protocol, Seldon Core's services), run
    in the handler process; the front's gRPC server (``rpc.py``) forwards each call's method
    and message bytes."""

    #: The full names of the methods served (``/package.Service/Method``).
    methods: tuple[str, ...]
    #: Whether :meth:`call` returns an awaitable (run on the handler process's event loop).
    is_async: bool

    def call(
        self, method: str, payload: bytes, metadata: tuple[tuple[str, str], ...]
    ) -> RpcResult | Awaitable[RpcResult]: ...


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
    #: Paths of the service port that the front answers itself (KServe's ``/metrics``).
    front_paths: tuple[str, ...] = ()
