"""KServe's Open Inference (V2) gRPC protocol over the model that the kserve style loaded.

The answers are kserve's own: its ``InferenceServicer`` checks a request, turns it into an
``InferRequest`` (typed ``contents`` or ``raw_input_contents``), runs the model through the
same ``DataPlane`` as the REST routes, and turns the ``InferResponse`` back into a
``ModelInferResponse``, with the stubs generated from the protocol's ``.proto`` that ship in
the kserve package. The front's gRPC server (``rpc.py``) forwards each call's method and
message bytes to the handler process; this module parses the message, runs the servicer's
method and serializes its answer, and says errors with the status codes of KServe's
``ExceptionToStatusInterceptor``.

Served: ``ServerLive``, ``ServerReady``, ``ServerMetadata``, ``ModelReady``,
``ModelMetadata``, ``ModelInfer``. The repository extension's load and unload are not served
(``UNIMPLEMENTED``), as on the REST port.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple

import grpc

from abeja_runtime.styles import RpcResult
from abeja_runtime.styles._common import finish_now, require

__all__ = ["HTTP_STATUS", "GrpcService"]

_log = logging.getLogger("abeja_runtime")
_SERVICE: Final = "/inference.GRPCInferenceService/"
_SERVED: Final = (
    "ServerLive", "ServerReady", "ServerMetadata", "ModelReady", "ModelMetadata", "ModelInfer",
)  # fmt: skip
#: The HTTP status the access log and the metrics count for a gRPC status (the mapping of
#: gRPC's own HTTP gateway, with CANCELLED as the 499 of a client that left).
HTTP_STATUS: Final = {
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


class _Metadatum(NamedTuple):
    """One metadata entry as grpc gives it (kserve reads ``.key`` and ``.value``)."""

    key: str
    value: str


class _Metadata:
    """The part of a ``ServicerContext`` that kserve's servicer reads (the request headers)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = tuple(_Metadatum(key, value) for key, value in metadata)

    def invocation_metadata(self) -> tuple[_Metadatum, ...]:
        return self._metadata


class GrpcService:
    """The V2 inference service's methods, called with the client's message bytes."""

    def __init__(
        self, dataplane: Any, repository: Any, *, is_async: bool, enter: Callable[[], None]
    ) -> None:
        servicer_module = require("kserve.protocol.grpc.servicer", "kserve")
        extension = require("kserve.protocol.model_repository_extension", "kserve")
        messages = require("kserve.protocol.grpc.grpc_predict_v2_pb2", "kserve")
        self._errors = require("kserve.errors", "kserve")
        inner = servicer_module.InferenceServicer(
            dataplane, extension.ModelRepositoryExtension(model_registry=repository)
        )
        self._methods = {
            _SERVICE + name: (getattr(messages, f"{name}Request"), getattr(inner, name))
            for name in _SERVED
        }
        self.methods = tuple(self._methods)
        self.is_async = is_async
        self._enter = enter  # run first in each call (a transformer's predictor)

    def call(
        self, method: str, payload: bytes, metadata: tuple[tuple[str, str], ...]
    ) -> RpcResult | Awaitable[RpcResult]:
        request_type, run = self._methods[method]
        try:
            request = request_type.FromString(payload)
        except Exception as exc:  # protobuf's DecodeError
            return self._refused(grpc.StatusCode.INVALID_ARGUMENT, f"bad message: {exc}")
        if self.is_async:
            return self._call_async(run, request, metadata)
        try:
            self._enter()
            response = finish_now(run(request, _Metadata(metadata)))
        except Exception as exc:
            return self._failed(exc)
        return _ok(response)

    async def _call_async(
        self, run: Any, request: Any, metadata: tuple[tuple[str, str], ...]
    ) -> RpcResult:
        try:
            self._enter()
            response = await run(request, _Metadata(metadata))
        except Exception as exc:
            return self._failed(exc)
        return _ok(response)

    def _failed(self, exc: Exception) -> RpcResult:
        code, message = self.status(exc)
        return self._refused(code, message)

    @staticmethod
    def _refused(code: grpc.StatusCode, message: str) -> RpcResult:
        return code.value[0], b"", message, HTTP_STATUS.get(code, 500)

    def status(self, exc: Exception) -> tuple[grpc.StatusCode, str]:
        """KServe's ExceptionToStatusInterceptor: the same codes and messages."""
        errors = self._errors
        code = grpc.StatusCode.INTERNAL
        for types, mapped in (
            (
                (errors.InferenceError, errors.InvalidInput, errors.UnsupportedProtocol),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (
                (errors.ServerNotReady, errors.ServerNotLive, errors.ModelNotReady),
                grpc.StatusCode.UNAVAILABLE,
            ),
            ((NotImplementedError,), grpc.StatusCode.UNIMPLEMENTED),
            ((errors.ModelNotFound,), grpc.StatusCode.NOT_FOUND),
        ):
            if isinstance(exc, types):
                code = mapped
                break
        if code is grpc.StatusCode.INTERNAL:
            _log.error("the KServe model failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
            return code, "Internal server error"
        _log.warning("KServe gRPC call refused (%s): %s", code.name, exc)
        return code, str(getattr(exc, "reason", None) or exc)


def _ok(response: Any) -> RpcResult:
    return grpc.StatusCode.OK.value[0], response.SerializeToString(), "", 200
