"""Cortex request handlers in front of an ONNX model (onnxruntime) or a TensorFlow SavedModel.

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

The model is an ``.onnx`` file, run with onnxruntime (``signature``: its ``NodeArg`` lists,
the outputs a list of arrays), or a TensorFlow SavedModel directory, run with TensorFlow when
it is installed (``signature``: the SavedModel's ``map<string, SignatureDef>`` as TF Serving
describes it, ``{"serving_default": {"inputs": {...}, "outputs": {...}, "methodName": ...}}``;
the outputs a dict by output name), as Cortex's two model formats were.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol

from abeja_runtime.config import Config, resolve_training_result_dir
from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.styles._common import (
    BodyNotJson,
    json_result,
    parse_json,
    read_body,
    require,
    text_result,
)
from abeja_runtime.styles.cortex import CortexOptions
from abeja_runtime.worker.request import Request

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
#: TensorFlow's DataType names (a SignatureDef's ``dtype``) → numpy dtypes.
_TF_TYPES: Final = {
    "DT_HALF": "float16",
    "DT_FLOAT": "float32",
    "DT_DOUBLE": "float64",
    "DT_INT8": "int8",
    "DT_INT16": "int16",
    "DT_INT32": "int32",
    "DT_INT64": "int64",
    "DT_UINT8": "uint8",
    "DT_UINT16": "uint16",
    "DT_UINT32": "uint32",
    "DT_UINT64": "uint64",
    "DT_BOOL": "bool",
    "DT_STRING": "object",
}
_SUMMARY: Final = "make a prediction by sending a post request to this endpoint with a json payload"
_SAVED_MODEL: Final = "saved_model.pb"
_SERVING_KEY: Final = "serving_default"
_FROZEN_GRAPH: Final = (
    "is a TensorFlow graph file (.pb); the Cortex style serves a SavedModel directory (the one "
    "that holds saved_model.pb) or an ONNX file: point --cortex-model at one of them"
)


class _PredictionFailed(Exception):
    """A step of the pipeline failed; Cortex answered 406 with this reason."""


def adapt(
    module: ModuleType, *, config: Config, options: CortexOptions, workdir: Path
) -> LoadedHandler:
    """Load the model and wrap the module's request-handler functions around it."""
    numpy = require("numpy", "cortex")
    model_path = _model_path(config, options, workdir)
    saved = model_path.is_dir()
    model: _Model = _SavedModel(numpy, model_path) if saved else _OnnxModel(numpy, model_path)
    pipeline = _Pipeline(numpy, model, module, dict(options.cortex_metadata))
    _log.info(
        "Cortex request handler %s (%s generation) in front of %s (%s); inputs %s",
        module.__name__,
        "(sample, metadata)" if pipeline.legacy else "(sample, signature, metadata)",
        model_path,
        model.format,
        model.describe(),
    )
    return LoadedHandler(pipeline.handle, is_async=False, name=config.handler, style="cortex")


def _model_path(config: Config, options: CortexOptions, workdir: Path) -> Path:
    """The configured model, or the only ``*.onnx`` file or SavedModel directory in the
    training-result or working dir."""
    if options.cortex_model:
        if "://" in options.cortex_model:
            raise HandlerLoadError(
                f"--cortex-model {options.cortex_model} is a remote location; download the "
                "model and give the path of the local .onnx file or SavedModel directory"
            )
        path = workdir / options.cortex_model
        if path.suffix == ".pb" and path.name != _SAVED_MODEL:
            raise HandlerLoadError(f"{path} {_FROZEN_GRAPH}")
        if path.name == _SAVED_MODEL:
            path = path.parent
        if path.is_dir() and not _is_saved_model(path):
            raise HandlerLoadError(
                f"the Cortex model {path} is a directory without {_SAVED_MODEL}; give a "
                "TensorFlow SavedModel directory or an .onnx file (--cortex-model)"
            )
        if not path.exists():
            raise HandlerLoadError(f"the Cortex model {path} does not exist (--cortex-model)")
        return path
    places = [resolve_training_result_dir(workdir, config.training_result_dir), workdir]
    for place in places:
        found = _models_in(place)
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            names = ", ".join(path.name for path in found)
            raise HandlerLoadError(
                f"{place} holds several models ({names}); choose one with --cortex-model "
                "or ABEJA_RUNTIME_CORTEX_MODEL"
            )
    raise HandlerLoadError(
        "the Cortex style needs a model: set --cortex-model or ABEJA_RUNTIME_CORTEX_MODEL to "
        "an .onnx file or a TensorFlow SavedModel directory (none found in "
        f"{' or '.join(str(place) for place in places)})"
    )


def _models_in(place: Path) -> list[Path]:
    """The ``*.onnx`` files and SavedModel directories of ``place`` (itself included)."""
    if not place.is_dir():
        return []
    if _is_saved_model(place):
        return [place]
    onnx = sorted(place.glob("*.onnx"))
    saved = sorted(child for child in place.iterdir() if _is_saved_model(child))
    return [*onnx, *saved]


def _is_saved_model(path: Path) -> bool:
    return (path / _SAVED_MODEL).is_file()


class _Model(Protocol):
    """What the pipeline needs of a model, whatever runs it."""

    format: str
    #: What ``pre_inference`` / ``post_inference`` get as ``signature``.
    input_signature: Any
    output_signature: Any
    input_names: list[str]

    def tensor(self, value: Any, name: str) -> Any: ...

    def run(self, feed: dict[str, Any]) -> Any: ...

    def describe(self) -> dict[str, Any]: ...


class _OnnxModel:
    """An ONNX file run with onnxruntime; outputs are a list of arrays, in the model's order."""

    format = "ONNX, onnxruntime"

    def __init__(self, numpy: Any, path: Path) -> None:
        onnxruntime = require("onnxruntime", "cortex")
        try:
            self._session = onnxruntime.InferenceSession(
                str(path), providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise HandlerLoadError(f"onnxruntime cannot load the model {path}: {exc}") from exc
        self._np = numpy
        self.input_signature = self._session.get_inputs()
        self.output_signature = self._session.get_outputs()
        self._nodes = {node.name: node for node in self.input_signature}
        self.input_names = list(self._nodes)

    def tensor(self, value: Any, name: str) -> Any:
        node = self._nodes[name]
        shape = [dim if isinstance(dim, int) else 1 for dim in node.shape]
        return _array(self._np, value, name, _NUMPY_TYPES.get(node.type), shape)

    def run(self, feed: dict[str, Any]) -> Any:
        return list(self._session.run([], feed))

    def describe(self) -> dict[str, Any]:
        return {
            node.name: {"shape": node.shape, "type": _NUMPY_TYPES.get(node.type, node.type)}
            for node in self.input_signature
        }


class _SavedModel:
    """A TensorFlow SavedModel's serving signature (``serving_default``, or its only one),
    called with TensorFlow; outputs are a dict of arrays by output name."""

    format = "TensorFlow SavedModel"

    def __init__(self, numpy: Any, path: Path) -> None:
        # TensorFlow's own C++ log lines would bypass the JSON log; the user may ask for them.
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        tensorflow = require("tensorflow", "cortex")
        definitions = _signature_definitions(path)
        key = _serving_key(definitions, path)
        try:
            self._loaded = tensorflow.saved_model.load(str(path))  # keeps the variables alive
            self._function = self._loaded.signatures[key]
        except Exception as exc:
            raise HandlerLoadError(f"TensorFlow cannot load the model {path}: {exc}") from exc
        self._np = numpy
        self._tf = tensorflow
        self.input_signature = self.output_signature = definitions
        self._inputs: dict[str, Any] = definitions[key].get("inputs", {})
        self.input_names = list(self._inputs)

    def tensor(self, value: Any, name: str) -> Any:
        spec = self._inputs[name]
        shape = [max(size, 1) for size in _dims(spec)]  # unknown (-1) as 1, as for ONNX
        return _array(self._np, value, name, _TF_TYPES.get(spec.get("dtype", "")), shape)

    def run(self, feed: dict[str, Any]) -> Any:
        tensors = {name: self._tf.constant(value) for name, value in feed.items()}
        outputs = self._function(**tensors)
        return {name: tensor.numpy() for name, tensor in outputs.items()}

    def describe(self) -> dict[str, Any]:
        return {
            name: {
                "shape": [
                    int(d.get("size", -1)) for d in spec.get("tensorShape", {}).get("dim", [])
                ],
                "type": _TF_TYPES.get(spec.get("dtype", ""), spec.get("dtype")),
            }
            for name, spec in self._inputs.items()
        }


def _dims(spec: dict[str, Any]) -> list[int]:
    """A SignatureDef tensor's shape; -1 where it is unknown."""
    return [int(dim.get("size", -1)) for dim in spec.get("tensorShape", {}).get("dim", [])]


def _signature_definitions(path: Path) -> dict[str, Any]:
    """The serving meta graph's signatures, as TF Serving's metadata describes them (JSON)."""
    protobuf = require("tensorflow.core.protobuf.saved_model_pb2", "cortex")
    json_format = require("google.protobuf.json_format", "cortex")
    saved = protobuf.SavedModel()
    try:
        saved.ParseFromString((path / _SAVED_MODEL).read_bytes())
    except Exception as exc:
        raise HandlerLoadError(
            f"{path / _SAVED_MODEL} is not a readable SavedModel: {exc}"
        ) from exc
    graphs = [graph for graph in saved.meta_graphs if "serve" in graph.meta_info_def.tags]
    if not graphs:
        raise HandlerLoadError(f"the SavedModel {path} has no meta graph tagged 'serve'")
    return {
        key: json_format.MessageToDict(definition)
        for key, definition in graphs[0].signature_def.items()
        if not key.startswith("__")  # TensorFlow's own (__saved_model_init_op)
    }


def _serving_key(definitions: dict[str, Any], path: Path) -> str:
    if _SERVING_KEY in definitions:
        return _SERVING_KEY
    if len(definitions) == 1:
        return next(iter(definitions))
    raise HandlerLoadError(
        f"the SavedModel {path} has no {_SERVING_KEY} signature and several others "
        f"({', '.join(sorted(definitions))}); save it with signatures={{'{_SERVING_KEY}': ...}}"
    )


def _array(numpy: Any, value: Any, name: str, dtype: str | None, shape: list[int]) -> Any:
    try:
        return numpy.asarray(value, dtype=dtype).reshape(shape)
    except Exception as exc:
        raise _PredictionFailed(
            f'key "{name}": failed to convert to a {dtype} array of shape {shape}: {exc}'
        ) from exc


class _Pipeline:
    """pre_inference → onnxruntime → post_inference for one request."""

    def __init__(
        self, numpy: Any, model: _Model, module: ModuleType, metadata: dict[str, Any]
    ) -> None:
        self._np = numpy
        self._model = model
        self._metadata = metadata
        self.inputs = model.input_signature
        self.outputs = model.output_signature
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
                outputs = _plain_all(self._run(prepared))
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

    def _run(self, prepared: Any) -> Any:
        feed = self._feed(prepared)
        try:
            return self._model.run(feed)
        except Exception as exc:
            raise _PredictionFailed(str(exc)) from exc

    def _feed(self, sample: Any) -> dict[str, Any]:
        """Cortex's conversion: dict by input name, or the bare value for a one-input model."""
        names, model = self._model.input_names, self._model
        if len(names) == 1 and not isinstance(sample, dict):
            return {names[0]: model.tensor(sample, names[0])}
        if not isinstance(sample, dict):
            keys = ", ".join(f'"{name}"' for name in names)
            raise _PredictionFailed(f"expected sample to be a dictionary with keys {keys}")
        feed = {}
        for name in names:
            if sample.get(name) is None:
                raise _PredictionFailed(f'missing key "{name}"')
            feed[name] = model.tensor(sample[name], name)
        return feed

    def _describe_endpoint(self, request: Request) -> EncodedResponse:
        if request.path == "/healthz":
            return json_result({"ok": True})
        described = self._model.describe()
        if self.legacy and request.path.endswith("/signature"):
            return json_result({"signature": described})
        return json_result({"model_signature": described, "message": _SUMMARY})


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


def _plain_all(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return {name: _plain(value) for name, value in outputs.items()}
    return [_plain(output) for output in outputs]
