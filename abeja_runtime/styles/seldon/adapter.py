"""Seldon Core Python components: a class with ``predict(X, features_names[, meta])``.

The class is instantiated without arguments and its ``load()`` is called, once per worker, as
Seldon's microservice does. Requests and responses are SeldonMessage JSON, handled the way
``seldon-core``'s Python wrapper handles them (without depending on it):

* ``POST /predict``, ``/api/v1.0/predictions`` (and ``/api/v0.1/...``, and ``/`` for
  ``abeja model run-local``) call ``predict_raw(message)`` if the class has it, else
  ``predict(X, names, meta=...)`` with ``X`` from ``data.ndarray`` / ``data.tensor`` (numpy),
  ``jsonData`` (dict), ``strData`` (str) or ``binData`` (bytes);
* ``/transform-input`` and ``/transform-output`` call the transformer methods;
* ``GET /health/ping`` → ``pong``, ``/health/status`` → ``health_status()``,
  ``/metadata`` → ``init_metadata()`` (or ``metadata()``);
* the answer carries the result in the request's form (``tensor`` for a tensor request, else
  ``ndarray``; ``names`` from ``class_names()``), and ``meta.tags`` / ``meta.metrics`` from
  ``tags()`` / ``metrics()`` and from a returned ``SeldonResponse``; those metrics are also
  exported on the runtime's ``/metrics`` (COUNTER, GAUGE, TIMER, as seldon-core does);
* errors are Seldon's ``{"status": {"status": 1, "info": ..., "code": -1, "reason": ...}}``.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import json
import logging
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from abeja_runtime.config import Config, parse_bool
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.metrics import reported_metrics
from abeja_runtime.styles import LoadedHandler, tftensor
from abeja_runtime.styles._common import json_result, media_type, read_body, require, text_result
from abeja_runtime.styles.seldon import SeldonOptions
from abeja_runtime.styles.seldon.errors import SeldonError
from abeja_runtime.worker.request import Request

__all__ = ["adapt"]

_log = logging.getLogger("abeja_runtime")
_METRIC_TYPES: Final = ("COUNTER", "GAUGE", "TIMER")
_PREDICT: Final = ("/predict", "/api/v1.0/predictions", "/api/v0.1/predictions", "/")
#: path → (allowed methods, action)
_ROUTES: Final = {
    **{path: (("POST",), "predict") for path in _PREDICT},
    "/predict": (("GET", "POST"), "predict"),
    "/transform-input": (("GET", "POST"), "transform_input"),
    "/transform-output": (("GET", "POST"), "transform_output"),
    "/health/ping": (("GET",), "ping"),
    "/health/status": (("GET",), "health"),
    "/api/v1.0/health/status": (("GET",), "health"),
    "/metadata": (("GET",), "metadata"),
    "/api/v1.0/metadata": (("GET",), "metadata"),
    **{f"{prefix}/route": (("GET", "POST"), "route") for prefix in ("", "/api/v1.0", "/api/v0.1")},
    **{
        f"{prefix}/aggregate": (("GET", "POST"), "aggregate")
        for prefix in ("", "/api/v1.0", "/api/v0.1")
    },
    "/send-feedback": (("GET", "POST"), "send_feedback"),
    "/api/v1.0/feedback": (("GET", "POST"), "send_feedback"),
    "/api/v0.1/feedback": (("GET", "POST"), "send_feedback"),
}
#: seldon-core's counters of feedback: how many came with a reward, and the rewards' sum.
_FEEDBACK_KEY: Final = "seldon_api_model_feedback"
_FEEDBACK_REWARD_KEY: Final = "seldon_api_model_feedback_reward"
#: seldon-core's image name for a unit that has no PREDICTIVE_UNIT_IMAGE.
_NOT_IMPLEMENTED_IMAGE: Final = "NOT_IMPLEMENTED:NOT_IMPLEMENTED"
_METADATA_DEFAULTS: Final = {
    "name": "",
    "versions": [""],
    "platform": "",
    "inputs": [],
    "outputs": [],
    "custom": {},
}


#: ``_call``'s fallback for a method that seldon-core refuses to do without.
_UNDEFINED: Final = object()


def adapt(subject: Any, *, config: Config, options: SeldonOptions, workdir: Path) -> LoadedHandler:
    """Instantiate the class with its parameters (or take the instance), call ``load()``."""
    if options.seldon_service_type not in _SERVICE_TYPES:
        raise HandlerLoadError(
            f"--service-type {options.seldon_service_type!r} is not one of "
            f"{', '.join(_SERVICE_TYPES)}"
        )
    numpy = require("numpy", "seldon")
    parameters = parse_parameters(options.seldon_parameters)
    if parameters and not inspect.isclass(subject):
        raise HandlerLoadError(
            f"HANDLER[{config.handler}] names an instance, but constructor parameters are set "
            "(--parameters / PREDICTIVE_UNIT_PARAMETERS); name the class instead"
        )
    try:
        model: Any = subject(**parameters) if inspect.isclass(subject) else subject
        if callable(getattr(model, "load", None)):
            model.load()
    except Exception as exc:
        raise HandlerLoadError(
            f"the Seldon model {config.handler} failed to start: {type(exc).__name__}: {exc}"
        ) from exc
    metadata = _environment_metadata(options.seldon_metadata)
    unit = _Unit(options.seldon_unit_id, options.seldon_unit_image)
    component = _Component(numpy, model, metadata, unit, _error_handlers(model))
    rpc = None
    if config.grpc_port is not None:
        from abeja_runtime.styles.seldon.grpc_service import SeldonGrpcService  # protobuf only then

        rpc = SeldonGrpcService(component)
    return LoadedHandler(
        component.handle, is_async=False, name=config.handler, style="seldon", rpc=rpc
    )


#: seldon-core's microservice types (its --service-type), and the output transformer of its
#: graph documentation.
_SERVICE_TYPES: Final = (
    "MODEL",
    "ROUTER",
    "TRANSFORMER",
    "COMBINER",
    "OUTPUT_TRANSFORMER",
    "OUTLIER_DETECTOR",
)

_PARAMETER_TYPES: Final[dict[str, Callable[[str], Any]]] = {
    "INT": int,
    "FLOAT": float,
    "DOUBLE": float,
    "STRING": str,
    "BOOL": parse_bool,
}


def parse_parameters(text: str) -> dict[str, Any]:
    """seldon-core's constructor parameters: ``[{"name", "value", "type"}, ...]`` → kwargs."""
    if not text.strip():
        return {}
    problem = 'it must be a JSON list of {"name": ..., "value": ..., "type": ...}'
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HandlerLoadError(f"the Seldon parameters are not JSON ({exc}); {problem}") from None
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise HandlerLoadError(f"the Seldon parameters {text!r} are not valid; {problem}")
    parsed = {}
    for item in items:
        name, value, kind = item.get("name"), item.get("value"), item.get("type")
        convert = _PARAMETER_TYPES.get(str(kind))
        if not isinstance(name, str) or not name or convert is None:
            raise HandlerLoadError(
                f"Bad model parameter {item!r}: it needs a name and a type among "
                f"{', '.join(_PARAMETER_TYPES)}"
            )
        try:
            parsed[name] = convert(str(value))
        except ValueError:
            raise HandlerLoadError(
                f"Bad model parameter: {name} with value {value} can't be parsed as a {kind}"
            ) from None
    return parsed


def _environment_metadata(text: str) -> dict[str, Any]:
    """``MODEL_METADATA`` (YAML, so JSON too); unreadable metadata is logged and ignored, as
    seldon-core does."""
    if not text.strip():
        return {}
    import yaml

    try:
        found = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        _log.error("reading the model metadata from MODEL_METADATA failed: %s", exc)
        return {}
    if not isinstance(found, dict):
        _log.error("MODEL_METADATA must be a mapping, got %r", found)
        return {}
    return found


def _not_implemented(exc: BaseException) -> bool:
    """seldon-core's SeldonComponent base raises this for methods a class does not define."""
    return any(cls.__name__ == "SeldonNotImplementedError" for cls in type(exc).__mro__)


@dataclass(frozen=True)
class _Unit:
    """This component's place in the inference graph (``PREDICTIVE_UNIT_ID``, ``_IMAGE``)."""

    id: str
    #: PREDICTIVE_UNIT_IMAGE, empty when not set.
    image_given: str

    @property
    def image(self) -> str:
        return self.image_given or _NOT_IMPLEMENTED_IMAGE

    def request_path(self) -> dict[str, str]:
        """seldon-core's ``get_request_path``: this unit's image under its id, once it has one."""
        return {self.id: self.image} if self.id else {}


_ErrorHandlers = Callable[[Exception], EncodedResponse | None]


def _error_handlers(model: Any) -> _ErrorHandlers | None:
    """The class's ``model_error_handler``: a Flask blueprint whose ``app_errorhandler``
    functions answer the exceptions they name, registered on a Flask app as seldon-core does.
    Returns a function that answers an exception with them, or None when none applies."""
    blueprint = getattr(model, "model_error_handler", None)
    if blueprint is None:
        return None
    flask = require("flask", "seldon")
    app = flask.Flask("seldon-model-error-handler")
    try:
        app.register_blueprint(blueprint)
    except Exception as exc:
        raise HandlerLoadError(
            f"model_error_handler must be a flask.Blueprint, got {type(blueprint).__name__}: {exc}"
        ) from exc
    _log.info("registered the model's custom error handler (model_error_handler)")

    def answer(exc: Exception) -> EncodedResponse | None:
        with app.test_request_context():
            try:
                returned = app.handle_user_exception(exc)
            except Exception as again:
                if again is exc:  # no handler for it: re-raised as it was
                    return None
                raise
            response = app.make_response(returned)
            headers = tuple(
                (name, value)
                for name, value in response.headers.items()
                if name.lower() != "content-length"
            )
            return EncodedResponse(response.status_code, headers, response.get_data())

    return answer


class _Component:
    """One user object and the SeldonMessage handling around it."""

    def __init__(
        self,
        numpy: Any,
        model: Any,
        environment_metadata: dict[str, Any],
        unit: _Unit,
        error_handlers: _ErrorHandlers | None,
    ) -> None:
        self._np = numpy
        self._model = model
        self._unit = unit
        #: Read and checked once at start; None when it is invalid.
        self.metadata = self._init_metadata(environment_metadata)
        self._error_handlers = error_handlers
        #: seldon-core's INCLUDE_METRICS_IN_CLIENT_RESPONSE (default true): with false, custom
        #: metrics are exported on /metrics but left out of the client's ``meta.metrics``. Not
        #: a setting of the runtime: seldon-core's own variable, read here as seldon-core reads
        #: it (the one ``os.environ`` read below the command line; see config.py).
        self._metrics_to_client = (
            os.environ.get("INCLUDE_METRICS_IN_CLIENT_RESPONSE", "true").lower() == "true"
        )
        #: Turns a message a ``*_raw`` method answered into its JSON form (set by gRPC).
        self.json_form: Callable[[Any], Any] | None = None

    def handle(self, request: Request, context: dict[str, Any]) -> EncodedResponse:
        route = _ROUTES.get(request.path.rstrip("/") or "/")
        if route is None:
            return json_result(SeldonError(f"not found: {request.path}").to_dict(), 404)
        methods, action = route
        if request["http_method"] not in methods:
            error = SeldonError(f"method {request['http_method']} is not allowed here")
            return json_result(error.to_dict(), 405)
        try:
            if action == "ping":
                return text_result("pong", content_type="text/html; charset=utf-8")
            if action == "health":
                return json_result(self._health())
            if action == "metadata":
                if self.metadata is None:
                    raise SeldonError(
                        "Model metadata unavailable", 500, "MICROSERVICE_BAD_METADATA"
                    )
                return json_result(self.metadata)
            response = self.answer(action, _message(request))
        except Exception as exc:
            return self._error(exc)
        status = _status_of(response)
        return json_result(response, status)

    def answer(self, action: str, message: Any, raw_message: Any = None) -> Any:
        """The answer to ``action`` (``predict``, ``transform_input``, ``transform_output``,
        ``route``, ``aggregate``, ``send_feedback``) for a message in its JSON form; raises
        what the component raised. ``raw_message``: what a ``*_raw`` method gets instead of
        the JSON form (the gRPC message itself, as seldon-core gives it)."""
        raw = message if raw_message is None else raw_message
        if action == "route":
            return self._route(message, raw)
        if action == "aggregate":
            return self._aggregate(message, raw)
        if action == "send_feedback":
            return self._feedback(message, raw)
        return self._run(action, message, raw)

    def _run(self, action: str, message: Any, raw_message: Any) -> Any:
        raw, answer = self._raw(action, raw_message)
        if raw:
            return answer
        features, meta = self._features(message)
        fallback = [] if action == "predict" else features
        result = self._call(action, features, _names(message), meta, fallback)
        data, tags, metrics = _unpack(result)
        return self._response(message, data, meta, self._to_client(self._metrics(metrics)), tags)

    def _route(self, message: Any, raw_message: Any) -> Any:
        """A router: ``route(X, names)`` picks a child by index, -1 for none (seldon-core)."""
        raw, answer = self._raw("route", raw_message)
        if raw:
            return answer
        features, meta = self._features(message)
        routing = self._call("route", features, _names(message), meta, _UNDEFINED)
        if not isinstance(routing, int):
            raise SeldonError(f"Routing response must be int but got {routing}")
        routed = self._np.array([[routing]])
        return self._response(message, routed, meta, self._to_client(self._metrics([])), {})

    def _aggregate(self, message: Any, raw_message: Any) -> Any:
        """A combiner: ``aggregate(Xs, names_list)`` over a ``SeldonMessageList``."""
        raw, answer = self._raw("aggregate", raw_message)
        if raw:
            return answer
        messages = message.get("seldonMessages") if isinstance(message, dict) else None
        if not isinstance(messages, list) or not messages:
            raise SeldonError(f"Invalid request data type: {message}")
        features_list = [self._features(item)[0] for item in messages]
        names_list = [_names(item) for item in messages]
        method = getattr(self._model, "aggregate", None)
        if not callable(method):  # seldon-core's words, for a component that is no combiner
            raise SeldonError("Aggregate not defined")
        result = method(features_list, names_list)
        data, tags, metrics = _unpack(result)
        first_meta = messages[0].get("meta") if isinstance(messages[0], dict) else None
        return self._response(
            messages[0], data, first_meta, self._to_client(self._metrics(metrics)), tags
        )

    def _feedback(self, message: Any, raw_message: Any) -> Any:
        """``send_feedback(X, names, reward, truth, routing=...)`` for a ``Feedback`` message."""
        if not isinstance(message, dict) or not isinstance(message.get("request"), dict):
            raise SeldonError(f"Invalid request data type: {message}")
        reward = message.get("reward")
        if reward and isinstance(reward, int | float) and not isinstance(reward, bool):
            exported = reported_metrics()
            exported.record("COUNTER", _FEEDBACK_KEY, 1, {})
            exported.record("COUNTER", _FEEDBACK_REWARD_KEY, reward, {})
        raw, answer = self._raw("send_feedback", raw_message)
        if raw:
            return answer
        request = message["request"]
        features, _ = self._features(request)
        truth = (
            self._features(message["truth"])[0] if isinstance(message.get("truth"), dict) else None
        )
        response_meta = (message.get("response") or {}).get("meta") or {}
        routing = (response_meta.get("routing") or {}).get(self._unit.id)
        method = getattr(self._model, "send_feedback", None)
        result = None
        if callable(method):
            result = method(features, _names(request), reward, truth, routing=routing)
        answer = self._np.array([] if result is None else result)
        response = self._response(request, answer, None, self._to_client(self._metrics([])), {})
        data = response.get("data")
        if isinstance(data, dict) and not data.get("names"):
            del data["names"]  # seldon-core answers feedback through protobuf, which drops it
        return response

    def _to_client(self, metrics: list[Any]) -> list[Any]:
        """The metrics exported on /metrics; those that also go into the client's answer."""
        exported = _reported(metrics)
        return exported if self._metrics_to_client else []

    def _raw(self, action: str, message: Any) -> tuple[bool, Any]:
        """``<action>_raw(message)`` when the class has it (and it is implemented)."""
        raw = getattr(self._model, f"{action}_raw", None)
        if callable(raw):
            try:
                answer = raw(message)
                if self.json_form is not None and not isinstance(answer, dict | list):
                    answer = self.json_form(answer)  # a gRPC message answered with one
                meta = answer.get("meta") if isinstance(answer, dict) else None
                metrics = meta.get("metrics") if isinstance(meta, dict) else None
                # as seldon-core's handle_raw_custom_metrics: exported, and kept or not
                if metrics and _valid_metrics(metrics) and not self._to_client(metrics):
                    del answer["meta"]["metrics"]
                return True, answer
            except Exception as exc:
                if not _not_implemented(exc):
                    raise
        return False, None

    def _call(self, name: str, features: Any, names: Any, meta: Any, fallback: Any) -> Any:
        """The component's ``name`` method, or ``fallback`` where it has none (``_UNDEFINED``:
        seldon-core's 400 "<Name> not defined", as for a router's ``route``)."""
        method = getattr(self._model, name, None)
        if callable(method):
            try:
                if _takes_meta(method):
                    return method(features, names, meta=meta)
                return method(features, names)
            except Exception as exc:
                if not _not_implemented(exc):
                    raise
        if fallback is _UNDEFINED:
            raise SeldonError(f"{name.capitalize()} not defined")
        return fallback

    def _features(self, message: Any) -> tuple[Any, Any]:
        """Seldon's ``extract_request_parts_json``: the payload as the model receives it."""
        if not isinstance(message, dict):
            raise SeldonError(f"Invalid request data type: {message}")
        meta = message.get("meta")
        if "data" in message:
            return self._array(message["data"] or {}), meta
        if "jsonData" in message:
            return message["jsonData"], meta
        if "strData" in message:
            return message["strData"], meta
        if "binData" in message:
            try:
                return base64.b64decode(message["binData"]), meta
            except (binascii.Error, TypeError, ValueError) as exc:
                raise SeldonError(f"binData is not base64: {exc}") from exc
        raise SeldonError(f"Invalid request data type: {message}")

    def _data(self, request: Any, data: Any) -> dict[str, Any]:
        """A list or array the model returned, as the ``data`` of its answer: in the form the
        request's own ``data`` used (tensor, tftensor or ndarray), with the class names."""
        if not isinstance(data, list | self._np.ndarray):
            raise SeldonError(
                "Unknown data type returned as payload (must be list or np array):" + str(data)
            )
        array = data if isinstance(data, self._np.ndarray) else self._np.array(data)
        numeric = self._np.issubdtype(array.dtype, self._np.number)
        asked = request.get("data") if isinstance(request, dict) else None
        if numeric and (asked is None or "tensor" in asked):
            payload = {"tensor": {"values": array.ravel().tolist(), "shape": list(array.shape)}}
        elif numeric and "tftensor" in (asked or {}):
            payload = {"tftensor": tftensor.from_array(array, self._np)}
        else:
            payload = {"ndarray": array.tolist()}
        return {**payload, "names": self._class_names(array)}

    def _array(self, data: dict[str, Any]) -> Any:
        """A request's ``data``, as the array the model receives."""
        if "tensor" in data:
            tensor = data["tensor"]
            try:
                return self._np.array(tensor["values"]).reshape(tensor["shape"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SeldonError(f"Invalid tensor in request: {exc}") from exc
        if "ndarray" in data:
            return self._np.array(data["ndarray"])
        if "tftensor" in data:
            try:
                return tftensor.to_array(data["tftensor"], self._np)
            except tftensor.TensorError as exc:
                raise SeldonError(f"Invalid tftensor in request: {exc}") from None
        return self._np.array([])

    def _response(
        self, request: Any, data: Any, meta: Any, metrics: list[Any], tags: dict[str, Any]
    ) -> dict[str, Any]:
        """Seldon's ``construct_response_json``."""
        response: dict[str, Any] = {}
        if isinstance(data, dict):
            response["jsonData"] = data
        elif isinstance(data, bytes | bytearray):
            response["binData"] = base64.b64encode(data).decode("ascii")
        elif isinstance(data, str):
            response["strData"] = data
        else:
            response["data"] = self._data(request, data)
        meta = meta if isinstance(meta, dict) else {}
        # The request's own tags and metrics, updated in place as seldon-core does (a model
        # that returned its meta sees the additions in its answer there too).
        merged_tags = meta.get("tags", {})
        merged_tags.update(self._tags())
        merged_tags.update(tags)
        merged_metrics = meta.get("metrics", [])
        merged_metrics.extend(metrics)
        response["meta"] = {}
        if merged_tags:
            response["meta"]["tags"] = merged_tags
        if merged_metrics:
            response["meta"]["metrics"] = merged_metrics
        puid = (request.get("meta") or {}).get("puid") if isinstance(request, dict) else None
        if puid:
            response["meta"]["puid"] = puid
        request_path = {**self._unit.request_path(), **meta.get("requestPath", {})}
        if request_path:
            response["meta"]["requestPath"] = request_path
        return response

    def _class_names(self, array: Any) -> list[str]:
        if array.ndim < 2:
            return []
        names = getattr(self._model, "class_names", None)
        if inspect.ismethod(names):
            try:
                return list(names())
            except Exception as exc:
                if not _not_implemented(exc):
                    raise
        elif names is not None:
            return list(names)  # the deprecated attribute form
        return [f"t:{index}" for index in range(array.shape[1])]

    def _tags(self) -> dict[str, Any]:
        return dict(self._optional("tags") or {})

    def _metrics(self, runtime: list[Any]) -> list[Any]:
        if not _valid_metrics(runtime):
            raise SeldonError(
                f"Bad metric created during request: {json.dumps(runtime, default=str)}",
                500,
                "MICROSERVICE_BAD_METRIC",
            )
        custom = self._optional("metrics")
        if custom is None:
            return list(runtime)
        if not _valid_metrics(custom):
            raise SeldonError(
                f"Bad metric created during request: {json.dumps(custom, default=str)}",
                500,
                "MICROSERVICE_BAD_METRIC",
            )
        return [*custom, *runtime]

    def _optional(self, name: str) -> Any:
        """Call an optional method; None when it is missing or raises 'not implemented'."""
        method = getattr(self._model, name, None)
        if not callable(method):
            return None
        try:
            return method()
        except Exception as exc:
            if _not_implemented(exc):
                return None
            raise

    def _health(self) -> dict[str, Any]:
        method = getattr(self._model, "health_status", None)
        status: Any = "healthy"
        if callable(method):
            try:
                status = method()
            except Exception as exc:
                if not _not_implemented(exc):
                    raise
                status = "not implemented - assuming healthy"
        return self._response({}, status, None, self._to_client(self._metrics([])), {})

    def _image_metadata(self) -> dict[str, Any]:
        """seldon-core names a model after its image (``PREDICTIVE_UNIT_IMAGE``) by default."""
        if not self._unit.image_given:
            return {}
        *name, version = self._unit.image.split(":")
        return {"name": ":".join(name), "versions": [version]}

    def _init_metadata(self, environment: dict[str, Any]) -> dict[str, Any] | None:
        """Seldon reads the metadata once at start (``MODEL_METADATA`` under the model's own)
        and validates it; None means invalid."""
        found = self._optional("init_metadata")
        if found is None:
            found = self._optional("metadata")
        if found is None:
            found = {}
        if not isinstance(found, dict):
            _log.error("the Seldon model's init_metadata must return a dict, got %r", found)
            found = {}
        metadata = {**_METADATA_DEFAULTS, **self._image_metadata(), **environment, **found}
        problem = _metadata_problem(metadata)
        if problem:
            _log.error("invalid Seldon model metadata (%s): %r", problem, metadata)
            return None
        return metadata

    def _error(self, exc: Exception) -> EncodedResponse:
        if self._error_handlers is not None:
            answered = self._error_handlers(exc)
            if answered is not None:
                return answered
        if callable(getattr(exc, "to_dict", None)) and isinstance(
            getattr(exc, "status_code", None), int
        ):
            body, status = exc.to_dict(), exc.status_code  # type: ignore[attr-defined]
            _log.error("%s", body)
            return json_result(body, status)
        _log.exception("the Seldon model raised an error")
        error = SeldonError(str(exc), 500, "MICROSERVICE_INTERNAL_ERROR")
        return json_result(error.to_dict(), 500)


def _message(request: Request) -> Any:
    """Seldon's ``get_request``: multipart fields, a ``json`` form/query field, or the body."""
    mime = media_type(request["content_type"])
    if mime == "multipart/form-data":
        message: dict[str, Any] = {}
        for part in request["contents"]:
            name, value = part["form_name"], part.read()
            if name == "binData":
                message[name] = base64.b64encode(value).decode("ascii")
            elif name == "strData" or part["file_name"]:
                message[name] = value.decode("utf-8")
            else:
                message[name] = _json(value)
        return message
    text = request.query.get("json")
    posted_form = mime == "application/x-www-form-urlencoded" and request["http_method"] != "GET"
    if text is None and posted_form:
        form = urllib.parse.parse_qs(read_body(request).decode("utf-8", "replace"))
        text = form.get("json", [None])[0]
    if text is not None:
        return _json(text)
    body = read_body(request) if request["http_method"] != "GET" else b""
    if not body.strip():
        raise SeldonError("Can't find JSON in data")
    return _json(body)


def _json(value: str | bytes) -> Any:
    try:
        return json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SeldonError(f"Can't find JSON in data: {exc}") from exc


def _names(message: Any) -> list[Any]:
    """``data.names`` of a SeldonMessage, or none."""
    data = message.get("data") if isinstance(message, dict) else None
    names = data.get("names", []) if isinstance(data, dict) else []
    return names if isinstance(names, list) else []


def _unpack(result: Any) -> tuple[Any, dict[str, Any], list[Any]]:
    """A ``SeldonResponse`` carries runtime tags and metrics next to the data."""
    if type(result).__name__ == "SeldonResponse" and hasattr(result, "data"):
        return result.data, dict(result.tags or {}), list(result.metrics or [])
    return result, {}, []


def _takes_meta(method: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "meta" or p.kind is p.VAR_KEYWORD for p in params)


def _reported(metrics: list[Any]) -> list[Any]:
    """Export the component's metrics on the runtime's ``/metrics``, as seldon-core's wrapper
    exports them on its own; they stay in ``meta.metrics`` too."""
    exported = reported_metrics()
    for metric in metrics:
        tags = metric.get("tags")
        exported.record(
            metric["type"], metric["key"], metric["value"], tags if isinstance(tags, dict) else {}
        )
    return metrics


def _valid_metrics(metrics: Any) -> bool:
    if not isinstance(metrics, list):
        return False
    for metric in metrics:
        if not isinstance(metric, dict) or not {"key", "value", "type"} <= metric.keys():
            return False
        if metric["type"] not in _METRIC_TYPES:
            return False
        if isinstance(metric["value"], bool) or not isinstance(metric["value"], int | float):
            return False
    return True


def _metadata_problem(metadata: dict[str, Any]) -> str | None:
    unknown = set(metadata) - set(_METADATA_DEFAULTS)
    if unknown:
        return f"unknown keys {sorted(unknown)}"
    for key in ("name", "platform"):
        if not isinstance(metadata[key], str):
            return f"{key} must be a string"
    for key in ("versions", "inputs", "outputs"):
        if not isinstance(metadata[key], list):
            return f"{key} must be a list"
    if not isinstance(metadata["custom"], dict) or not all(
        isinstance(value, str) for value in metadata["custom"].values()
    ):
        return "custom must map names to strings"
    return None


def _status_of(response: Any) -> int:
    """A raw response may set the HTTP status in ``status.code``, as Seldon honours it."""
    if isinstance(response, dict) and isinstance(response.get("status"), dict):
        code = response["status"].get("code")
        if isinstance(code, int) and 100 <= code <= 599:
            return code
    return 200
