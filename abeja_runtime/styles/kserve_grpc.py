"""KServe's Open Inference (V2) gRPC protocol over the model that the kserve style loaded.

The answers are kserve's own: its ``InferenceServicer`` checks a request, turns it into an
``InferRequest`` (typed ``contents`` or ``raw_input_contents``), runs the model through the
same ``DataPlane`` as the REST routes, and turns the ``InferResponse`` back into a
``ModelInferResponse``, with the stubs generated from the protocol's ``.proto`` that ship in
the kserve package. This module only hands each call that reaches the model to the runtime
(``rpc.py``: admission, deadline, handler thread, access log) and says errors with the status
codes of KServe's ``ExceptionToStatusInterceptor``.

Served: ``ServerLive``, ``ServerReady``, ``ServerMetadata``, ``ModelReady``,
``ModelMetadata``, ``ModelInfer``. The repository extension's load and unload are not served
(``UNIMPLEMENTED``), as on the REST port.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Final

import grpc

from abeja_runtime.handler import RpcRunner
from abeja_runtime.styles._common import finish_now, require

__all__ = ["GrpcService"]

_log = logging.getLogger("abeja_runtime")
_SERVICE: Final = "/inference.GRPCInferenceService/"
#: Answered on the loop, as KServe does: they read the server's state, not the model's code.
_AT_ONCE: Final = ("ServerLive", "ServerReady", "ServerMetadata")
#: Run like a request: they may call the model's own methods (``healthy``, ``predict``, ...).
_BY_THE_MODEL: Final = ("ModelReady", "ModelMetadata", "ModelInfer")


class _Metadata:
    """The part of a ``ServicerContext`` that kserve's servicer reads (the request headers),
    safe to hand to a handler thread."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._metadata = tuple(context.invocation_metadata() or ())

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata


class GrpcService:
    """Registers the V2 inference service on the worker's gRPC server."""

    def __init__(
        self, dataplane: Any, repository: Any, *, is_async: bool, enter: Callable[[], None]
    ) -> None:
        servicer_module = require("kserve.protocol.grpc.servicer", "kserve")
        extension = require("kserve.protocol.model_repository_extension", "kserve")
        self._errors = require("kserve.errors", "kserve")
        self._inner = servicer_module.InferenceServicer(
            dataplane, extension.ModelRepositoryExtension(model_registry=repository)
        )
        self._is_async = is_async
        self._enter = enter  # run first in each call's context (a transformer's predictor)

    def register(self, server: Any, run: RpcRunner) -> None:
        stubs = require("kserve.protocol.grpc.grpc_predict_v2_pb2_grpc", "kserve")
        inner, errors = self._inner, self.status

        def answered_at_once(name: str) -> Any:
            async def method(request: Any, context: Any) -> Any:
                work = functools.partial(getattr(inner, name), request, context)
                return await run(
                    context, _SERVICE + name, work, is_async=True, errors=errors, admitted=False
                )

            return method

        def answered_by_the_model(name: str) -> Any:
            async def method(request: Any, context: Any) -> Any:
                work = functools.partial(
                    _entered, self._enter, getattr(inner, name), request, _Metadata(context)
                )
                if not self._is_async:  # kserve's coroutine never waits: run it on the thread
                    work = functools.partial(_finish_now, work)
                return await run(
                    context, _SERVICE + name, work, is_async=self._is_async, errors=errors
                )

            return method

        methods = {name: staticmethod(answered_at_once(name)) for name in _AT_ONCE}
        methods.update({name: staticmethod(answered_by_the_model(name)) for name in _BY_THE_MODEL})
        # Methods not listed answer UNIMPLEMENTED, as the generated base class does.
        servicer = type("Servicer", (stubs.GRPCInferenceServiceServicer,), methods)
        stubs.add_GRPCInferenceServiceServicer_to_server(servicer(), server)

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


def _finish_now(work: Any) -> Any:
    return finish_now(work())


def _entered(enter: Callable[[], None], method: Any, *args: Any) -> Any:
    enter()
    return method(*args)
