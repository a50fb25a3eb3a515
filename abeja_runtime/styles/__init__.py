"""Handlers written for other serving platforms, served unchanged next to ABEJA's own.

Each style is an adapter, loaded in the handler processes: it wraps what ``HANDLER`` names
into an ABEJA-style ``handler(request, context)`` that returns the usual result dict, so the
front's queue, deadlines, health checks, metrics and logs apply to every style alike (no second
server). A style with a gRPC protocol also brings an ``RpcService`` for ``--grpc-port``.

* ``abeja``: ``handler(request, context)`` (ABEJA Platform 19.04+), served as it is.
* ``abeja-v1``: ``handler(iterable, context)`` generators of the 18.10 images (:mod:`.v1`).
* ``cortex``: a request-handler module with ``pre_inference`` / ``post_inference`` in front of an
  ONNX model or a TensorFlow SavedModel (:mod:`.cortex`).
* ``kserve``: a ``kserve.Model`` subclass, V1 and V2 (Open Inference) REST and V2 gRPC
  (:mod:`.kserve`, :mod:`.kserve_grpc`, :mod:`.kserve_script` for ``python model.py``).
* ``seldon``: a Seldon Core Python class with ``predict`` and its kin, REST and gRPC
  (:mod:`.seldon`, :mod:`.seldon_grpc`).

``choose`` picks the style (``auto`` looks at what ``HANDLER`` names and says why in the
start-up log); ``adapt`` builds the handler. Nothing here imports aiohttp, and the optional
packages (numpy, Pillow, onnxruntime, kserve, protobuf) are imported by the adapter that needs
them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.handler import LoadedHandler

__all__ = ["Choice", "Target", "adapt", "choose"]

_MISSING: Final = object()
#: Methods that make a class a Seldon Core component (model or transformer).
_SELDON_METHODS: Final = (
    "predict",
    "predict_raw",
    "transform_input",
    "transform_output",
    "transform_input_raw",
    "transform_output_raw",
    "route",
    "route_raw",
    "aggregate",
    "aggregate_raw",
    "send_feedback",
    "send_feedback_raw",
)
#: kserve's base classes; a class deriving from one of them is a KServe model.
_KSERVE_BASES: Final = frozenset({"Model", "BaseKServeModel", "InferenceModel"})
_CORTEX_FUNCTIONS: Final = ("pre_inference", "post_inference")
#: The module of each adapter, imported only when its style is chosen.
_ADAPTERS: Final = {
    "abeja-v1": "abeja_runtime.styles.v1",
    "cortex": "abeja_runtime.styles.cortex",
    "kserve": "abeja_runtime.styles.kserve",
    "seldon": "abeja_runtime.styles.seldon",
}


@dataclass(frozen=True)
class Target:
    """What ``HANDLER`` names: the imported module and the attribute ('' for a module alone)."""

    spec: str
    module: ModuleType
    attribute: str

    MISSING = _MISSING

    @property
    def obj(self) -> Any:
        """The named object, or ``Target.MISSING`` (no attribute given, or not defined)."""
        if not self.attribute:
            return _MISSING
        return getattr(self.module, self.attribute, _MISSING)


@dataclass(frozen=True)
class Choice:
    """The chosen style, why (for the start-up log), and the object its adapter wraps."""

    style: str
    reason: str
    subject: Any = None


def choose(target: Target, requested: str) -> Choice:
    """The style to serve ``target`` with: ``requested``, or the detected one for ``auto``."""
    if requested == "auto":
        return _detect(target)
    why = "set with --style / ABEJA_RUNTIME_STYLE"
    if requested in ("abeja", "abeja-v1"):
        return Choice(requested, why, target.obj)
    if requested == "cortex":
        return Choice("cortex", why, target.module)
    subject = target.obj
    if subject is _MISSING:
        found = _detect_in_module(target.module)
        subject = found.subject if found is not None and found.style == requested else _MISSING
    fits = _is_kserve_model if requested == "kserve" else _is_seldon_component
    if subject is _MISSING or not fits(subject):
        raise HandlerLoadError(_misfit_message(target, requested))
    return Choice(requested, why, subject)


def adapt(choice: Choice, subject: Any, config: Config, workdir: Path) -> LoadedHandler:
    """Wrap ``subject`` into an ABEJA-style handler with the adapter of ``choice.style``."""
    adapter = importlib.import_module(_ADAPTERS[choice.style])
    handler: LoadedHandler = adapter.adapt(subject, config=config, workdir=workdir)
    return handler


def _detect(target: Target) -> Choice:
    obj, name = target.obj, target.attribute
    if obj is _MISSING:
        return _detect_in_module(target.module) or Choice(
            "abeja", "the default: no other style matched", obj
        )
    if inspect.isgeneratorfunction(obj) or inspect.isasyncgenfunction(obj):
        return Choice(
            "abeja-v1", f"{name} is a generator function, as the 18.10 image's handlers are", obj
        )
    if inspect.isfunction(obj) and obj.__name__ in _CORTEX_FUNCTIONS:
        return Choice("cortex", f"{name} is a Cortex request-handler function", target.module)
    if _is_kserve_model(obj):
        return Choice("kserve", f"{name} is a kserve.Model", obj)
    if _is_seldon_component(obj) and (inspect.isclass(obj) or not callable(obj)):
        return Choice("seldon", f"{name} has Seldon's {_seldon_method(obj)} method", obj)
    return Choice("abeja", f"{name} is a handler(request, context) callable", obj)


def _detect_in_module(module: ModuleType) -> Choice | None:
    """A module named alone (or whose named attribute is missing): look at what it defines."""
    defined = [name for name in _CORTEX_FUNCTIONS if inspect.isfunction(getattr(module, name, 0))]
    if defined:
        return Choice("cortex", f"{module.__name__} defines {' and '.join(defined)}", module)
    cls = _class_named_like(module)
    if cls is not None and _is_kserve_model(cls):
        return Choice("kserve", f"{module.__name__}.{cls.__name__} is a kserve.Model", cls)
    if cls is not None and _is_seldon_component(cls):
        return Choice(
            "seldon",
            f"{module.__name__}.{cls.__name__} is named like its module and has Seldon's "
            f"{_seldon_method(cls)} method",
            cls,
        )
    model = _only_kserve_model(module)
    if model is not None:
        return Choice("kserve", f"{module.__name__}.{model.__name__} is a kserve.Model", model)
    components = _defined_classes(module, _is_seldon_component)
    if len(components) == 1:
        (cls,) = components
        return Choice(
            "seldon",
            f"{module.__name__}.{cls.__name__} is its only class, with Seldon's "
            f"{_seldon_method(cls)} method",
            cls,
        )
    return None


def _defined_classes(module: ModuleType, kind: Callable[[Any], bool]) -> list[type]:
    """Classes written in ``module`` itself (not imported into it) that are of ``kind``."""
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and value.__module__ == module.__name__ and kind(value)
    ]


def _class_named_like(module: ModuleType) -> type | None:
    """Seldon's convention: ``MyModel.py`` holds ``class MyModel``."""
    value = getattr(module, module.__name__.rpartition(".")[2], None)
    return value if inspect.isclass(value) else None


def _only_kserve_model(module: ModuleType) -> type | None:
    models = _defined_classes(module, _is_kserve_model)
    if len(models) > 1:
        names = ", ".join(sorted(model.__name__ for model in models))
        raise HandlerLoadError(
            f"{module.__name__} defines several kserve.Model classes ({names}); name the one "
            f"to serve in HANDLER, e.g. {module.__name__}:{models[0].__name__}"
        )
    return models[0] if models else None


def _is_kserve_model(obj: Any) -> bool:
    """True for a subclass (or instance) of kserve's Model, without importing kserve."""
    cls = obj if inspect.isclass(obj) else type(obj)
    return any(
        base.__name__ in _KSERVE_BASES and base.__module__.partition(".")[0] == "kserve"
        for base in cls.__mro__[1:]
    )


def _is_seldon_component(obj: Any) -> bool:
    return not _is_kserve_model(obj) and _seldon_method(obj) is not None


def _seldon_method(obj: Any) -> str | None:
    return next((name for name in _SELDON_METHODS if callable(getattr(obj, name, None))), None)


def _misfit_message(target: Target, style: str) -> str:
    expected = {
        "kserve": "a kserve.Model subclass (or an instance of one)",
        "seldon": "a class with a predict(X, features_names) method (or an instance of one)",
    }[style]
    found = target.obj
    what = (
        f"module {target.module.__name__} defines no such class"
        if found is _MISSING
        else f"it names a {type(found).__name__}"
    )
    return (
        f"HANDLER[{target.spec}] is served with the {style} style, which needs {expected}; "
        f"{what}. Point HANDLER at it, e.g. model:MyModel."
    )
