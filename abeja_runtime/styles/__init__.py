"""Handler styles: handlers written for other serving platforms, served unchanged next to ABEJA's.

A style turns what ``HANDLER`` names into an ABEJA-style ``handler(request, context)`` that
returns the usual result dict, so that the front's queue, deadlines, health checks, metrics and
logs apply to every style alike (no second server). A style with a gRPC protocol also brings an
``RpcService`` for ``--grpc-port``.

Each style is a module or package of this folder that defines ``STYLE``, a :class:`Style`, and
is named in :data:`REGISTERED`: adding one is that module and one line there. Its settings are
its own options dataclass (:mod:`abeja_runtime.settings`), which the command line, the docs and
:class:`~abeja_runtime.config.Config` take from it. What declares a style stays light: the
front imports every style for its options; what a style needs to serve (numpy, Pillow,
onnxruntime, kserve, protobuf) is imported by its :meth:`Style.load`, in the handler process.

* ``abeja``: ``handler(request, context)`` (ABEJA Platform 19.04+), served as it is.
* ``abeja-v1``: ``handler(iterable, context)`` generators of the 18.10 images.
* ``cortex``: a request-handler module with ``pre_inference`` / ``post_inference`` in front of an
  ONNX model or a TensorFlow SavedModel.
* ``kserve``: a ``kserve.Model`` subclass, V1 and V2 (Open Inference) REST and V2 gRPC, and the
  ``python model.py`` main-script habit.
* ``seldon``: a Seldon Core Python class with ``predict`` and its kin, REST and gRPC.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.errors import HandlerLoadError

if TYPE_CHECKING:
    from abeja_runtime.config import Config
    from abeja_runtime.worker.handler import LoadedHandler

__all__ = [
    "REGISTERED",
    "Choice",
    "ClassStyle",
    "Style",
    "Target",
    "choose",
    "class_named_like",
    "defined_classes",
    "misfit",
    "registered",
    "style_named",
    "style_names",
]

#: The styles, by the module (or package) of this folder that declares each, in the order
#: ``auto`` tries them: the first whose :meth:`Style.detect` recognises what HANDLER names
#: serves it; ``abeja``, last, takes what no other does.
REGISTERED: Final = ("abeja_v1", "cortex", "kserve", "seldon", "abeja")
_MISSING: Final = object()


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
    """The style that serves a target, why (for the start-up log), and what it wraps."""

    style: Style
    reason: str
    subject: Any


class Style:
    """What a style is to the rest of the runtime; each style's ``STYLE`` is one of these."""

    #: The name ``--style`` takes.
    name: str = ""
    #: What it serves, a few words for ``--style``'s help.
    summary: str = ""
    #: Its settings: a frozen dataclass of :func:`~abeja_runtime.settings.setting` fields (and
    #: plain fields that only a command sets), or None.
    options: type | None = None
    #: HANDLER may name a module alone (a Cortex request-handler file, a Seldon class named
    #: like its module, a module with one KServe model).
    module_only: bool = False

    def detect(self, target: Target) -> Choice | None:
        """For ``--style auto``: a choice of this style, with the reason, where what HANDLER
        names is written for it; else None."""
        return None

    def fit(self, target: Target) -> Any:
        """For ``--style`` naming this style: what :meth:`load` wraps; a
        :class:`HandlerLoadError` that says what to name where HANDLER names nothing fit."""
        raise NotImplementedError

    def load_itself(self, config: Config, options: Any, workdir: Path) -> LoadedHandler | None:
        """A style that starts HANDLER its own way (KServe's ``python model.py``) returns the
        handler; None (the default) has the loader import HANDLER as usual."""
        return None

    def load(self, subject: Any, config: Config, options: Any, workdir: Path) -> LoadedHandler:
        """The handler, in the handler process: the style's packages imported, the model built
        and loaded, requests routed and answered as the platform it comes from does."""
        raise NotImplementedError


class ClassStyle(Style):
    """A style that serves a class (or an instance of one): the one HANDLER names, or the one
    that a module named alone defines (:meth:`in_module`)."""

    module_only = True
    #: What HANDLER must name, for the error when it names something else.
    expected: str = ""

    def serves(self, obj: Any) -> bool:
        """Whether ``obj`` is a class (or an instance) of this style."""
        raise NotImplementedError

    def in_module(self, module: ModuleType) -> Choice | None:
        """The class of this style that ``module`` defines, if it defines one."""
        raise NotImplementedError

    def fit(self, target: Target) -> Any:
        subject = target.obj
        if subject is _MISSING:
            found = self.in_module(target.module)
            subject = found.subject if found is not None else _MISSING
        if subject is _MISSING or not self.serves(subject):
            raise misfit(target, self.name, self.expected)
        return subject


@functools.cache
def registered() -> tuple[Style, ...]:
    """Every style, in :data:`REGISTERED`'s order."""
    return tuple(importlib.import_module(f"{__name__}.{name}").STYLE for name in REGISTERED)


def style_names() -> tuple[str, ...]:
    """What ``--style`` takes: ``auto`` and each style's name."""
    return ("auto", *(style.name for style in registered()))


def style_named(name: str) -> Style:
    for style in registered():
        if style.name == name:
            return style
    raise ValueError(f"style must be one of {', '.join(style_names())}, got {name!r}")


def choose(target: Target, requested: str) -> Choice:
    """The style to serve ``target`` with: ``requested``, or the detected one for ``auto``."""
    if requested != "auto":
        style = style_named(requested)
        return Choice(style, "set with --style / ABEJA_RUNTIME_STYLE", style.fit(target))
    for style in registered():
        choice = style.detect(target)
        if choice is not None:
            return choice
    raise AssertionError("the last style takes every handler")


def defined_classes(module: ModuleType, kind: Callable[[Any], bool]) -> list[type]:
    """Classes written in ``module`` itself (not imported into it) that are of ``kind``."""
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value) and value.__module__ == module.__name__ and kind(value)
    ]


def class_named_like(module: ModuleType) -> type | None:
    """Seldon's convention: ``MyModel.py`` holds ``class MyModel``."""
    value = getattr(module, module.__name__.rpartition(".")[2], None)
    return value if inspect.isclass(value) else None


def misfit(target: Target, style: str, expected: str) -> HandlerLoadError:
    """HANDLER names nothing that ``style`` serves: what it needs, and what was found."""
    found = target.obj
    what = (
        f"module {target.module.__name__} defines no such class"
        if found is _MISSING
        else f"it names a {type(found).__name__}"
    )
    return HandlerLoadError(
        f"HANDLER[{target.spec}] is served with the {style} style, which needs {expected}; "
        f"{what}. Point HANDLER at it, e.g. model:MyModel."
    )
