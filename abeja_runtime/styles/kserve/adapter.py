"""KServe custom models: a ``kserve.Model`` subclass served with the V1 and V2 REST protocols
(and V2 gRPC with ``--grpc-port``, ``grpc_service.py``).

``HANDLER`` names the class (instantiated as ``cls(model_name)``, ``--model-name``, default
``model`` as in KServe) or an instance. ``load()`` runs at start-up unless the model is ready
already, and a model that is still not ready stops the start, as ``ModelServer.start`` does.

Requests go through the user's installed ``kserve`` package itself: its ``DataPlane`` decodes
bodies (JSON, CloudEvents, the V2 binary extension) and encodes answers (``InferResponse`` →
V2 JSON), and ``Model.__call__`` runs ``preprocess`` → ``predict`` → ``postprocess``, sync or
async. This module only routes, as KServe's FastAPI app does:

* V1: ``GET /v1/models``, ``GET /v1/models/{name}``, ``POST /v1/models/{name}:predict`` and
  ``:explain``;
* V2 / Open Inference: ``GET /v2``, ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models``,
  ``/v2/models/{name}``, ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``;
* ``GET /`` → ``{"status": "alive"}``; ``POST /`` (what ``abeja model run-local`` sends) is
  ``/v2/models/{name}/infer`` for a body with ``inputs``, else ``/v1/models/{name}:predict``.

Errors are KServe's: ``{"error": ...}`` with 400 (invalid input), 404 (unknown model), 501
(not implemented), 503 (not ready), 500 (anything else); unknown routes ``{"detail": ...}``.
When every method the class overrides is a plain ``def``, the model runs on the handler
thread like any sync handler; with an ``async def`` among them it runs on the event loop.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import re
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any, Final, Union

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.styles._common import (
    JSON,
    BodyNotJson,
    finish_now,
    header_dict,
    json_result,
    media_type,
    parse_json,
    read_body,
    require,
    text_result,
)
from abeja_runtime.styles.kserve import KserveOptions
from abeja_runtime.worker.request import Request

__all__ = ["adapt"]

_log = logging.getLogger("abeja_runtime")
#: Methods whose user override decides whether the adapter must be async.
_MODEL_METHODS: Final = (
    "__call__",
    "preprocess",
    "predict",
    "postprocess",
    "explain",
    "healthy",
    "get_input_types",
    "get_output_types",
)
_V1_MODEL: Final = re.compile(r"^/v1/models/(?P<name>[^/:]+)$")
_V1_VERB: Final = re.compile(r"^/v1/models/(?P<name>[^/]+):(?P<verb>predict|explain)$")
_V2_MODEL: Final = re.compile(
    r"^/v2/models/(?P<name>[^/]+)(?P<version>/versions/[^/]+)?(?P<tail>/ready|/infer)?$"
)
_BINARY_HEADER: Final = "inference-header-content-length"
_NOT_FOUND: Final = ({"detail": "Not Found"}, 404)
#: KServe serves Prometheus metrics on its HTTP port: the front answers it with its own scrape
#: (the same as ``/metrics`` on the health-check port).
_FRONT_PATHS: Final = ("/metrics",)


def _kserve_app(dataplane: Any) -> Any:
    """KServe's own FastAPI application with its routes for ``dataplane``, as its ModelServer
    builds it (never run: only its OpenAPI document is used)."""
    fastapi = require("fastapi", "kserve")
    rest = require("kserve.protocol.rest.server", "kserve")
    extension = require("kserve.protocol.model_repository_extension", "kserve")
    app = fastapi.FastAPI(
        title="KServe ModelServer", version=metadata.version("kserve"), redoc_url=None
    )
    routes = types.SimpleNamespace(
        dataplane=dataplane,
        model_repository_extension=extension.ModelRepositoryExtension(
            model_registry=dataplane.model_registry
        ),
    )
    rest.RESTServer._register_endpoints(routes, app)
    return app


#: The kserve releases the style is tested with (the test extra installs them): it uses kserve's
#: internals (``DataPlane``, ``ModelRepository``, the gRPC servicer), which change between
#: minor releases. Another release is served, with a warning in the log.
TESTED_KSERVE: Final = ">=0.21,<0.22"


def untested(version: str) -> bool:
    """Whether kserve ``version`` is outside :data:`TESTED_KSERVE` (by its minor release)."""
    low, high = (part.lstrip("<>=") for part in TESTED_KSERVE.split(","))
    minor = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    return not tuple(map(int, low.split("."))) <= minor < tuple(map(int, high.split(".")))


def adapt(
    subject: Any,
    *,
    config: Config,
    options: KserveOptions,
    workdir: Path,
    predictor: Any = None,
) -> LoadedHandler:
    """Instantiate and load the model; route KServe's REST protocols to it.

    ``predictor``: a transformer's ``PredictorConfig`` (``script.py``), which KServe
    keeps in a context variable; every call sets it in its own context, as ``ModelServer``
    set it in the one context its calls ran in.
    """
    require("kserve", "kserve")
    version = metadata.version("kserve")
    if untested(version):
        _log.warning(
            "kserve %s is not a release this runtime was tested with (%s); the KServe style "
            "uses its internals: if its requests fail, pin kserve%s in requirements.txt",
            version,
            TESTED_KSERVE,
            TESTED_KSERVE,
        )
    dataplane_module = require("kserve.protocol.dataplane", "kserve")
    repository_module = require("kserve.model_repository", "kserve")
    datamodels = require("kserve.protocol.rest.v2_datamodels", "kserve")
    try:
        model = _instantiate(subject, options.model_name)
        if not model.ready:
            model.load()
    except Exception as exc:
        raise HandlerLoadError(
            f"the KServe model {config.handler} failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    if not model.ready:
        raise HandlerLoadError(
            f"Model with name {model.name} is not ready. Its load() must set self.ready = True "
            "(KServe's ModelServer refuses to start in that case too)."
        )
    repository = repository_module.ModelRepository()
    repository.update(model)
    dataplane = dataplane_module.DataPlane(model_registry=repository)
    enter = _predictor_setter(predictor)
    server = _Server(dataplane, datamodels, enter, docs=options.kserve_docs)
    server.model_name = model.name
    # kserve's own predict() awaits the network to reach a transformer's predictor.
    forwards = getattr(predictor, "predictor_host", None) and not _overrides(model, "predict")
    is_async = _is_async(model) or bool(forwards)
    rpc = None
    if config.grpc_port is not None:
        from abeja_runtime.styles.kserve.grpc_service import (
            GrpcService,
        )  # grpcio only when asked for

        rpc = GrpcService(dataplane, repository, is_async=is_async, enter=enter)
    # As kserve's ModelRepository.unload, which its ModelServer calls for each model as it stops.
    stop = model.stop if callable(getattr(model, "stop", None)) else None
    if is_async:
        return LoadedHandler(
            server.handle,
            True,
            config.handler,
            style="kserve",
            rpc=rpc,
            stop=stop,
            front_paths=_FRONT_PATHS,
        )

    def handle(request: Request, context: dict[str, Any]) -> EncodedResponse:
        answer: EncodedResponse = finish_now(server.handle(request, context))
        return answer

    return LoadedHandler(
        handle, False, config.handler, style="kserve", rpc=rpc, stop=stop, front_paths=_FRONT_PATHS
    )


def _predictor_setter(predictor: Any) -> Callable[[], None]:
    """What each call runs first: sets the transformer's predictor, or nothing."""
    if predictor is None:
        return _nothing
    context = require("kserve.context", "kserve")
    return functools.partial(context.set_predictor_config, predictor)


def _nothing() -> None:
    pass


def _instantiate(subject: Any, name: str) -> Any:
    if not inspect.isclass(subject):
        return subject
    factory: Any = subject  # a user's class: its __init__ is not object's
    try:
        inspect.signature(subject).bind(name)
    except TypeError:
        return factory()  # a class that names itself: def __init__(self)
    return factory(name)


def _is_async(model: Any) -> bool:
    """True when a method the user wrote (not kserve's default) is a coroutine function."""
    for name in _MODEL_METHODS:
        owner = _owner(model, name)
        if owner is None or owner.__module__.partition(".")[0] == "kserve":
            continue
        if inspect.iscoroutinefunction(vars(owner)[name]):
            return True
    return False


def _overrides(model: Any, name: str) -> bool:
    owner = _owner(model, name)
    return owner is not None and owner.__module__.partition(".")[0] != "kserve"


def _owner(model: Any, name: str) -> type | None:
    return next((cls for cls in type(model).__mro__ if name in vars(cls)), None)


class _Unprocessable(Exception):
    """A V2 body FastAPI would refuse with 422 before KServe's handler ran; ``errors`` is its
    ``detail`` list."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("unprocessable request body")
        self.errors = errors


def _is_json(content_type: str | None) -> bool:
    """FastAPI's rule for parsing a body as JSON: application/json or application/*+json."""
    main, _, sub = media_type(content_type).partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


class _Server:
    """KServe's REST routes over one registered model."""

    model_name = ""

    def __init__(
        self, dataplane: Any, datamodels: Any, enter: Callable[[], None], *, docs: bool
    ) -> None:
        self._dataplane = dataplane
        self._enter = enter
        self._datamodels = datamodels
        self._docs = docs
        self._openapi_document: bytes | None = None
        self._errors = require("kserve.errors", "kserve")
        pydantic = require("pydantic", "kserve")
        # The type of the V2 infer endpoint's body parameter in KServe's FastAPI server.
        self._v2_request = pydantic.TypeAdapter(Union[datamodels.InferenceRequest, bytes])  # noqa: UP007 - a runtime value, not an annotation
        self._validation_error = pydantic.ValidationError

    async def handle(self, request: Request, context: dict[str, Any]) -> EncodedResponse:
        method, path = request["http_method"], request.path
        self._enter()
        try:
            return await self._route(method, path, request)
        except Exception as exc:
            return self._error(exc)

    async def _route(self, method: str, path: str, request: Request) -> EncodedResponse:
        fixed = {
            "/": self._live_root,
            "/v2": self._server_metadata,
            "/v2/health/live": self._live,
            "/v2/health/ready": self._ready,
            "/v1/models": self._models,
            "/v2/models": self._models,
            "/openapi.json": self._openapi,
        }
        if self._docs:
            fixed["/docs"] = self._swagger_ui
        if path == "/" and method == "POST":
            return await self._run_local(request)
        if path in fixed:
            return self._only(method, "GET") or await fixed[path]()
        if match := _V1_VERB.match(path):
            return self._only(method, "POST") or await self._infer(
                match["name"], request, read_body(request), explain=match["verb"] == "explain"
            )
        if match := _V1_MODEL.match(path):
            return self._only(method, "GET") or await self._model_ready(match["name"])
        if match := _V2_MODEL.match(path):
            return await self._v2_model(method, match, request)
        return json_result(*_NOT_FOUND)

    async def _v2_model(
        self, method: str, match: re.Match[str], request: Request
    ) -> EncodedResponse:
        """``/v2/models/<name>[/versions/<v>][/infer|/ready]``."""
        tail = match["tail"] or ""
        refused = self._only(method, "POST" if tail == "/infer" else "GET")
        if refused:
            return refused
        if match["version"]:
            raise NotImplementedError("Model versioning not supported yet.")
        if tail == "/infer":
            return await self._infer(match["name"], request, read_body(request), v2=True)
        if tail == "/ready":
            return await self._model_ready(match["name"])
        return await self._model_metadata(match["name"])

    @staticmethod
    def _only(method: str, allowed: str) -> EncodedResponse | None:
        if method == allowed:
            return None
        return json_result({"detail": "Method Not Allowed"}, 405, headers={"Allow": allowed})

    async def _openapi(self) -> EncodedResponse:
        """The OpenAPI document of KServe's own FastAPI server for this model (built once)."""
        if self._openapi_document is None:
            self._openapi_document = json.dumps(_kserve_app(self._dataplane).openapi()).encode()
        return text_result(self._openapi_document, content_type="application/json")

    async def _swagger_ui(self) -> EncodedResponse:
        """KServe's ``/docs`` (``--enable_docs_url``): FastAPI's Swagger UI page."""
        docs = require("fastapi.openapi.docs", "kserve")
        page = docs.get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="KServe ModelServer - Swagger UI",
            oauth2_redirect_url="/docs/oauth2-redirect",
        )
        return text_result(bytes(page.body), content_type="text/html; charset=utf-8")

    async def _live_root(self) -> EncodedResponse:
        return json_result(await self._dataplane.live())

    async def _live(self) -> EncodedResponse:
        live = (await self._dataplane.live())["status"] == "alive"
        if not live:
            raise self._errors.ServerNotLive()
        return json_result({"live": live})

    async def _ready(self) -> EncodedResponse:
        if not await self._dataplane.ready():
            raise self._errors.ServerNotReady()
        return json_result({"ready": True})

    async def _models(self) -> EncodedResponse:
        return json_result({"models": list(self._dataplane.model_registry.get_models())})

    async def _server_metadata(self) -> EncodedResponse:
        return json_result(
            {
                "name": "kserve",
                "version": metadata.version("kserve"),
                "extensions": ["model_repository_extension"],
            }
        )

    async def _model_ready(self, name: str) -> EncodedResponse:
        if not await self._dataplane.model_ready(name):
            raise self._errors.ModelNotReady(name)
        return json_result({"name": name, "ready": True})

    async def _model_metadata(self, name: str) -> EncodedResponse:
        found = await self._dataplane.model_metadata(name)
        response = self._datamodels.ModelMetadataResponse.model_validate(found)
        return json_result(response.model_dump(mode="json"))

    async def _run_local(self, request: Request) -> EncodedResponse:
        """``abeja model run-local`` posts to ``/``: pick the protocol from the body."""
        body = read_body(request)  # a request body can be read once
        try:
            parsed = parse_json(body)
        except BodyNotJson:
            parsed = None
        v2 = isinstance(parsed, dict) and "inputs" in parsed and "instances" not in parsed
        return await self._infer(self.model_name, request, body, v2=v2)

    async def _infer(
        self, name: str, request: Request, body: bytes, *, v2: bool = False, explain: bool = False
    ) -> EncodedResponse:
        dataplane = self._dataplane
        if not await dataplane.model_ready(name, True):
            raise self._errors.ModelNotReady(name)
        headers = header_dict(request)
        if v2:
            infer_request, attributes = self._decode_v2(name, body, headers), {}
        else:
            # KServe compares the whole header with its JSON types; "; charset=..." is fine here.
            decode_headers = {**headers, "content-type": media_type(headers.get("content-type"))}
            if not decode_headers["content-type"]:
                del decode_headers["content-type"]
            infer_request, attributes = dataplane.decode(body=body, headers=decode_headers)
        if explain:
            response, response_headers = await dataplane.explain(name, infer_request, headers)
        else:
            response, response_headers = await dataplane.infer(name, infer_request, headers)
        if inspect.isasyncgen(response) or hasattr(response, "__anext__"):
            raise NotImplementedError("streamed (async iterator) responses are not supported")
        response, encoded_headers = dataplane.encode(name, response, headers, attributes)
        extra = {**response_headers, **encoded_headers}
        extra.pop("content-length", None)
        content_type = extra.pop("content-type", None)
        extra = {key: str(value) for key, value in extra.items()}
        if isinstance(response, bytes | str):
            default = "application/octet-stream" if isinstance(response, bytes) else "text/plain"
            return text_result(response, content_type=content_type or default, headers=extra)
        if v2:
            validated = self._datamodels.InferenceResponse.model_validate(response)
            response = validated.model_dump(mode="json")
        return json_result(response, headers=extra, content_type=content_type or JSON)

    def _decode_v2(self, name: str, body: bytes, headers: dict[str, str]) -> Any:
        if _BINARY_HEADER in headers or not _is_json(headers.get("content-type")):
            payload: Any = body  # what KServe's endpoint gets as bytes, and judges itself
        else:
            payload = self._v2_body(body)
        request, _ = self._dataplane.decode(
            payload, headers, protocol_version="v2", model_name=name
        )
        return request

    def _v2_body(self, body: bytes) -> Any:
        """The JSON body as FastAPI gives it to KServe's V2 endpoint, whose body parameter is
        ``Union[InferenceRequest, bytes]``: a body that is not JSON, or not of that type, is
        :class:`_Unprocessable`, with FastAPI's error list.

        A valid request is parsed once, by pydantic straight from the bytes (about 5 times
        faster than FastAPI's two passes on a 100,000-value tensor); only a body that fails is
        parsed again FastAPI's way, to answer with FastAPI's very errors."""
        try:
            return self._datamodels.InferenceRequest.model_validate_json(body)
        except self._validation_error:
            pass
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError) as exc:  # also too deep, or a 4,300-digit number
            position, why = (
                (exc.pos, exc.msg) if isinstance(exc, json.JSONDecodeError) else (0, str(exc))
            )
            raise _Unprocessable(
                [
                    {
                        "type": "json_invalid",
                        "loc": ["body", position],
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": why},
                    }
                ]
            ) from None
        try:
            return self._v2_request.validate_python(parsed, from_attributes=True)
        except self._validation_error as exc:
            found = json.loads(exc.json(include_url=False))
            raise _Unprocessable(
                [{**error, "loc": ["body", *error["loc"]]} for error in found]
            ) from None

    def _error(self, exc: Exception) -> EncodedResponse:
        """KServe's exception handlers: the same status codes and ``{"error": ...}`` bodies."""
        if isinstance(exc, _Unprocessable):  # FastAPI's own answer to a body it cannot take
            return json_result({"detail": exc.errors}, 422)
        errors = self._errors
        status = 500
        for names, code in (
            (("InvalidInput",), 400),
            (("ModelNotFound",), 404),
            (("ModelNotReady", "ServerNotReady", "ServerNotLive"), 503),
            (("UnsupportedProtocol",), 501),
        ):
            if any(isinstance(exc, getattr(errors, n, ())) for n in names):
                status = code
                break
        else:
            if isinstance(exc, NotImplementedError):
                status = 501
        known = status != 500 or isinstance(exc, getattr(errors, "InferenceError", ()))
        message = str(exc) if known else f"{type(exc).__name__} : {exc}"
        if status >= 500:
            _log.error("the KServe model failed: %s", message, exc_info=exc)
        else:
            _log.warning("KServe request refused (%d): %s", status, message)
        return json_result({"error": message}, status)
