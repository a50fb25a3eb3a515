"""Seldon Core's gRPC services over the component that the seldon style loaded.

seldon-core's microservice serves, on ``--grpc-port``, the services ``Generic``, ``Model``,
``Router``, ``Transformer``, ``OutputTransformer``, ``Combiner`` and ``Seldon`` of its
``prediction.proto``, with the one user object behind them all; so does this module. A message
is turned into its JSON form (protobuf's own JSON mapping, which is seldon-core's REST API),
goes through the same component as a REST request, and the JSON answer is turned back into a
message: every data form (``data`` with ``ndarray``, ``tensor`` or ``tftensor``; ``binData``,
``strData``, ``jsonData``) is answered as on the REST routes. A ``*_raw`` method gets the
message itself, as seldon-core gives it, and may answer with a message or its JSON form.

The front's gRPC server (``rpc.py``) forwards each call's method and message bytes to the
handler process; this module runs in the handler process.

The protocol's descriptors are loaded from ``protos/seldon.desc`` (compiled from the
``.proto`` files beside it by ``scripts/compile-seldon-protos.sh``) into a descriptor pool of
their own, not protobuf's default one: a model that imports TensorFlow registers TensorFlow's
``tensor.proto`` there, and seldon-core's copy of it differs.

Errors are what grpcio makes of an exception raised in a servicer, as seen in seldon-core:
``UNKNOWN`` with the details ``Exception calling application: <the exception's text>``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from abeja_runtime.styles import RpcResult
from abeja_runtime.styles._common import require
from abeja_runtime.styles.seldon.errors import SeldonError

__all__ = ["SeldonGrpcService", "grpc_error_text"]

_log = logging.getLogger("abeja_runtime")
_DESCRIPTORS: Final = Path(__file__).with_name("protos") / "seldon.desc"
_PACKAGE: Final = "seldon.protos"
#: method → (request message, answer message, the component's action)
_METHODS: Final = {
    **{
        f"/{_PACKAGE}.{service}/{name}": (request, "SeldonMessage", action)
        for service, name, request, action in (
            ("Generic", "TransformInput", "SeldonMessage", "transform_input"),
            ("Generic", "TransformOutput", "SeldonMessage", "transform_output"),
            ("Generic", "Route", "SeldonMessage", "route"),
            ("Generic", "Aggregate", "SeldonMessageList", "aggregate"),
            ("Generic", "SendFeedback", "Feedback", "send_feedback"),
            ("Model", "Predict", "SeldonMessage", "predict"),
            ("Model", "SendFeedback", "Feedback", "send_feedback"),
            ("Router", "Route", "SeldonMessage", "route"),
            ("Router", "SendFeedback", "Feedback", "send_feedback"),
            ("Transformer", "TransformInput", "SeldonMessage", "transform_input"),
            ("OutputTransformer", "TransformOutput", "SeldonMessage", "transform_output"),
            ("Combiner", "Aggregate", "SeldonMessageList", "aggregate"),
            ("Seldon", "Predict", "SeldonMessage", "predict"),
            ("Seldon", "SendFeedback", "Feedback", "send_feedback"),
        )
    },
    f"/{_PACKAGE}.Model/Metadata": ("google.protobuf.Empty", "SeldonModelMetadata", "metadata"),
    f"/{_PACKAGE}.Seldon/ModelMetadata": (
        "SeldonModelMetadataRequest", "SeldonModelMetadata", "metadata",
    ),
    f"/{_PACKAGE}.Seldon/GraphMetadata": (
        "google.protobuf.Empty", "SeldonGraphMetadata", "graph_metadata",
    ),
}  # fmt: skip
#: gRPC status codes (grpc.StatusCode's numbers, without importing grpc here).
_OK: Final = 0
_UNKNOWN: Final = 2
_INVALID_ARGUMENT: Final = 3


class SeldonGrpcService:
    """The Seldon services' methods, called with the client's message bytes."""

    is_async = False

    def __init__(self, component: Any) -> None:
        require("google.protobuf", "seldon (gRPC)", "protobuf")
        from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

        pool = descriptor_pool.DescriptorPool()
        for file in descriptor_pb2.FileDescriptorSet.FromString(_DESCRIPTORS.read_bytes()).file:
            pool.Add(file)

        class_of = _class_maker(message_factory, pool)

        def message_class(name: str) -> Any:
            full_name = name if "." in name else f"{_PACKAGE}.{name}"
            return class_of(pool.FindMessageTypeByName(full_name))

        self._methods = {
            method: (message_class(request), message_class(answer), action)
            for method, (request, answer, action) in _METHODS.items()
        }
        self.methods = tuple(self._methods)
        self._json_format = json_format
        self._pool = pool
        self._component = component
        component.json_form = self._to_json

    def call(self, method: str, payload: bytes, metadata: tuple[tuple[str, str], ...]) -> RpcResult:
        request_type, answer_type, action = self._methods[method]
        try:
            request = request_type.FromString(payload)
        except Exception as exc:  # protobuf's DecodeError
            return _INVALID_ARGUMENT, b"", f"bad message: {exc}", 400
        try:
            if action == "metadata":  # read at start; seldon-core ignores fields it lacks
                message = self._json_format.ParseDict(
                    self._component.metadata or {},
                    answer_type(),
                    ignore_unknown_fields=True,
                    descriptor_pool=self._pool,
                )
            elif action == "graph_metadata":
                raise NotImplementedError("GraphMetadata not available on the Model level.")
            else:
                answer = self._component.answer(action, self._to_json(request), request)
                message = self._json_format.ParseDict(
                    answer, answer_type(), descriptor_pool=self._pool
                )
        except Exception as exc:
            # Seldon's own errors carry the HTTP status its REST route answers (400 for a
            # request the component cannot take): the access log and the metrics count that.
            status = getattr(exc, "status_code", None)
            http_status = status if isinstance(status, int) else 500
            if http_status < 500:
                _log.warning("Seldon gRPC call %s refused: %s", method, exc)
            else:
                _log.error("the Seldon component failed on %s: %s", method, exc, exc_info=exc)
            details = f"Exception calling application: {grpc_error_text(exc)}"
            return _UNKNOWN, b"", details, http_status
        return _OK, message.SerializeToString(), "", 200

    def _to_json(self, message: Any) -> Any:
        """A message in its JSON form, as seldon-core's ``seldon_message_to_json``."""
        return self._json_format.MessageToDict(message, descriptor_pool=self._pool)


def grpc_error_text(exc: Exception) -> str:
    """What grpcio says of ``exc`` after "Exception calling application: " in seldon-core: the
    exception's text, which for its own ``SeldonMicroserviceException`` (:class:`SeldonError`
    here) is empty: it does not pass its message to ``Exception``."""
    return "" if isinstance(exc, SeldonError) else str(exc)


def _class_maker(message_factory: Any, pool: Any) -> Callable[[Any], Any]:
    """How this protobuf makes the message class of a descriptor in ``pool``.

    No one call does it in every release Seldon users have: ``GetMessageClass`` came with
    protobuf 4.22, and ``MessageFactory.GetPrototype``, the only way before it, warns from 5.26
    and is gone from 6.30. seldon-core 1.18 pins protobuf 3.20 (``<4``), and a model's
    environment keeps seldon-core (``SeldonResponse``, ``SeldonClient``): both are needed.
    """
    maker: Callable[[Any], Any] | None = getattr(message_factory, "GetMessageClass", None)
    if maker is None:
        maker = message_factory.MessageFactory(pool).GetPrototype
    return maker
