"""Cortex request handlers in front of an ONNX model run with onnxruntime.

A Cortex request handler is a module with an optional ``pre_inference`` and an optional
``post_inference``. Cortex had two generations of them, and both work here:

* ``pre_inference(sample, signature, metadata)`` / ``post_inference(prediction, signature,
  metadata)``: the JSON payload is the sample, ``signature`` is the model's input (or output)
  ``onnxruntime.NodeArg`` list, ``metadata`` the user's dict (``--cortex-metadata``), and the
  response is whatever ``post_inference`` returns, as JSON. Without ``post_inference`` it is the
  raw list of model outputs.
* ``pre_inference(sample, metadata)`` / ``post_inference(prediction, metadata)``: here the second
  argument is the ``NodeArg`` list; the payload is ``{"samples": [...]}``, each sample goes
  through the pipeline, the outputs are lists, and the answer is ``{"predictions": [...]}``.

Between the two, the input is converted as Cortex did: a dict keyed by input names, or for a
one-input model the bare value, each made a numpy array of the input's type and reshaped to its
shape with symbolic dimensions as 1. Errors are Cortex's: ``400`` for a body that is not JSON,
``406 prediction failed: <reason>`` when a step fails.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from abeja_runtime.config import Config, resolve_training_result_dir
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.handler import LoadedHandler
from abeja_runtime.request import Request
from abeja_runtime.styles._common import (
    BodyNotJson,
    json_result,
    parse_json,
    read_body,
    require,
    text_result,
)

__all__ = ["adapt"]

_log = logging.getLogger("abeja_runtime")
#: ONNX tensor types → numpy dtypes (what onnxruntime's NodeArg.type says).
_NUMPY_TYPES: Final = {
    "tensor(float16)": "float16",
    "tensor(float)": "float32",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
    "tensor(string)": "object",
}
_SUMMARY: Final = "make a prediction by sending a post request to this endpoint with a json payload"
_NOT_SUPPORTED: Final = (
    "The Cortex adapter serves ONNX models only; TensorFlow SavedModels are not supported. "
    "Export the model to ONNX (e.g. python -m tf2onnx.convert --saved-model DIR --output "
    "model.onnx) and point --cortex-model / ABEJA_RUNTIME_CORTEX_MODEL at the .onnx file."
)


class _PredictionFailed(Exception):
    """A step of the pipeline failed; Cortex answered 406 with this reason."""


def adapt(module: ModuleType, *, config: Config, workdir: Path) -> LoadedHandler:
    """Load the ONNX model and wrap the module's request-handler functions around it."""
    numpy = require("numpy", "cortex")
    onnxruntime = require("onnxruntime", "cortex")
    model_path = _model_path(config, workdir)
    try:
        session = onnxruntime.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise HandlerLoadError(f"onnxruntime cannot load the model {model_path}: {exc}") from exc
    pipeline = _Pipeline(numpy, session, module, dict(config.cortex_metadata))
    _log.info(
        "Cortex request handler %s (%s generation) in front of %s; inputs %s",
        module.__name__,
        "(sample, metadata)" if pipeline.legacy else "(sample, signature, metadata)",
        model_path,
        pipeline.describe(pipeline.inputs),
    )
    return LoadedHandler(pipeline.handle, is_async=False, name=config.handler, style="cortex")


def _model_path(config: Config, workdir: Path) -> Path:
    """The configured model, or the only ``*.onnx`` in the training-result or working dir."""
    if config.cortex_model:
        if "://" in config.cortex_model:
            raise HandlerLoadError(
                f"--cortex-model {config.cortex_model} is a remote location; download the "
                "model and give the path of the local .onnx file"
            )
        path = workdir / config.cortex_model
        if _is_tensorflow(path):
            raise HandlerLoadError(f"{path} is a TensorFlow model. {_NOT_SUPPORTED}")
        if not path.is_file():
            raise HandlerLoadError(f"the Cortex model {path} does not exist (--cortex-model)")
        return path
    places = [resolve_training_result_dir(workdir, config.training_result_dir), workdir]
    for place in places:
        found = sorted(place.glob("*.onnx")) if place.is_dir() else []
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(path.name for path in found)
            raise HandlerLoadError(
                f"{place} holds several ONNX models ({names}); choose one with --cortex-model "
                "or ABEJA_RUNTIME_CORTEX_MODEL"
            )
    if any(_is_tensorflow(path) for place in places for path in (place, *_children(place))):
        raise HandlerLoadError(f"Only a TensorFlow model was found. {_NOT_SUPPORTED}")
    raise HandlerLoadError(
        "the Cortex style needs an ONNX model: set --cortex-model or ABEJA_RUNTIME_CORTEX_MODEL "
        f"to its file (no *.onnx file in {' or '.join(str(place) for place in places)})"
    )


def _is_tensorflow(path: Path) -> bool:
    return path.suffix == ".pb" or (path / "saved_model.pb").is_file()


def _children(place: Path) -> list[Path]:
    return [child for child in place.iterdir() if child.is_dir()] if place.is_dir() else []


class _Pipeline:
    """pre_inference → onnxruntime → post_inference for one request."""

    def __init__(
        self, numpy: Any, session: Any, module: ModuleType, metadata: dict[str, Any]
    ) -> None:
        self._np = numpy
        self._session = session
        self._metadata = metadata
        self.inputs = session.get_inputs()
        self.outputs = session.get_outputs()
        self._pre = _function(module, "pre_inference")
        self._post = _function(module, "post_inference")
        arities = {_arity(func) for func in (self._pre, self._post) if func is not None}
        if not arities <= {2, 3}:
            raise HandlerLoadError(
                f"{module.__name__}: pre_inference and post_inference take (sample, signature, "
                "metadata) or, in Cortex's first generation, (sample, metadata)"
            )
        if len(arities) > 1:
            raise HandlerLoadError(
                f"{module.__name__}: pre_inference and post_inference take different numbers of "
                "arguments; use (sample, signature, metadata) for both, or (sample, metadata)"
            )
        #: The first generation: (sample, metadata) and a {"samples": [...]} payload.
        self.legacy = arities == {2}

    def handle(self, request: Request, context: dict[str, Any]) -> EncodedResponse:
        if request["http_method"] == "GET":
            return self._describe_endpoint(request)
        try:
            payload = parse_json(read_body(request))
        except BodyNotJson:
            return text_result("Malformed JSON" if self.legacy else "malformed json", 400)
        try:
            if self.legacy:
                return json_result({"predictions": self._legacy_samples(payload)})
            return json_result(self._predict(payload))
        except _PredictionFailed as exc:
            _log.exception("prediction failed: %s", exc)
            return text_result(f"prediction failed: {exc}", 406)

    def _predict(self, sample: Any) -> Any:
        prepared = self._call(self._pre, "pre_inference", sample, self.inputs)
        outputs = self._run(prepared)
        return self._call(self._post, "post_inference", outputs, self.outputs, default=outputs)

    def _legacy_samples(self, payload: Any) -> list[Any]:
        if not isinstance(payload, dict) or "samples" not in payload:
            raise _PredictionFailed('top level "samples" key not found in request')
        samples = payload["samples"]
        if not isinstance(samples, list):
            raise _PredictionFailed(
                'expected the value of key "samples" to be a list of json objects'
            )
        predictions = []
        for number, sample in enumerate(samples, start=1):
            try:
                prepared = self._call(self._pre, "pre_inference", sample, self.inputs)
                outputs = [_plain(output) for output in self._run(prepared)]
                result = self._call(
                    self._post, "post_inference", outputs, self.outputs, default=outputs
                )
            except _PredictionFailed as exc:
                raise _PredictionFailed(f"sample {number}: {exc}") from exc
            predictions.append(result)
        return predictions

    def _call(
        self, func: Callable[..., Any] | None, name: str, value: Any, signature: Any, **kw: Any
    ) -> Any:
        if func is None:
            return kw.get("default", value)
        args = (value, signature) if self.legacy else (value, signature, self._metadata)
        try:
            return func(*args)
        except Exception as exc:
            raise _PredictionFailed(f"{name} request handler: {exc}") from exc

    def _run(self, prepared: Any) -> list[Any]:
        feed = self._feed(prepared)
        try:
            return list(self._session.run([], feed))
        except Exception as exc:
            raise _PredictionFailed(str(exc)) from exc

    def _feed(self, sample: Any) -> dict[str, Any]:
        """Cortex's conversion: dict by input name, or the bare value for a one-input model."""
        if len(self.inputs) == 1 and not isinstance(sample, dict):
            return {self.inputs[0].name: self._tensor(sample, self.inputs[0])}
        if not isinstance(sample, dict):
            keys = ", ".join(f'"{node.name}"' for node in self.inputs)
            raise _PredictionFailed(f"expected sample to be a dictionary with keys {keys}")
        feed = {}
        for node in self.inputs:
            if sample.get(node.name) is None:
                raise _PredictionFailed(f'missing key "{node.name}"')
            feed[node.name] = self._tensor(sample[node.name], node)
        return feed

    def _tensor(self, value: Any, node: Any) -> Any:
        dtype = _NUMPY_TYPES.get(node.type)
        shape = [dim if isinstance(dim, int) else 1 for dim in node.shape]
        try:
            array = self._np.asarray(value, dtype=dtype)
            return array.reshape(shape)
        except Exception as exc:
            raise _PredictionFailed(
                f'key "{node.name}": failed to convert to a {dtype} array of shape {shape}: {exc}'
            ) from exc

    def describe(self, nodes: Any) -> dict[str, Any]:
        return {
            node.name: {"shape": node.shape, "type": _NUMPY_TYPES.get(node.type, node.type)}
            for node in nodes
        }

    def _describe_endpoint(self, request: Request) -> EncodedResponse:
        if request.path == "/healthz":
            return json_result({"ok": True})
        if self.legacy and request.path.endswith("/signature"):
            return json_result({"signature": self.describe(self.inputs)})
        return json_result({"model_signature": self.describe(self.inputs), "message": _SUMMARY})


def _function(module: ModuleType, name: str) -> Callable[..., Any] | None:
    func = getattr(module, name, None)
    return func if callable(func) else None


def _arity(func: Callable[..., Any]) -> int:
    """Positional parameters; *args counts as the new generation's three."""
    params = inspect.signature(func).parameters.values()
    if any(param.kind is param.VAR_POSITIONAL for param in params):
        return 3
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(param.kind in positional for param in params)


def _plain(value: Any) -> Any:
    """The first generation handed post_inference lists, not numpy arrays."""
    return value.tolist() if hasattr(value, "tolist") else value
