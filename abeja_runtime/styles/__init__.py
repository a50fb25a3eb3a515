"""Handler styles: handlers written for other serving platforms, served unchanged next to ABEJA's.

A style turns what ``HANDLER`` names into a :class:`LoadedHandler`: an ABEJA-style
``handler(request, context)`` (an adapter's answers are already encoded: an
:class:`~abeja_runtime.encode.EncodedResponse`, in the other platform's own form), so that the
front's queue, deadlines, health checks, metrics and logs apply to every style alike (no second
server). A style with a gRPC protocol also brings an :class:`RpcService` for ``--grpc-port``.
This module is that contract, between the styles and the handler process
(:mod:`abeja_runtime.worker`), and it imports neither.

Each style is a module or package of this folder that defines ``STYLE``, a :class:`Style`, and
is listed in :data:`~abeja_runtime.styles_table.REGISTERED` (its name, its module and a few
words for ``--help``): adding one is that module and one line there. ``--style``'s choices and
help come from that table alone, so that :mod:`abeja_runtime.config` (and the front, which
imports it) loads no style. Its settings are its own options dataclass
(:mod:`abeja_runtime.settings`), which the command line (:mod:`abeja_runtime.options`, the one
place besides the handler process that imports every style) and the docs take from it. What
declares a style stays light; what a style needs to serve (numpy, Pillow, onnxruntime, kserve,
protobuf) is imported by its :meth:`Style.load`, in the handler process.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Protocol

from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.styles_table import REGISTERED, Listed, style_names

if TYPE_CHECKING:
    from abeja_runtime.config import Config

__all__ = [
    "REGISTERED",
    "Choice",
    "ClassStyle",
    "Listed",
    "LoadedHandler",
    "RpcResult",
    "RpcService",
    "Style",
    "Target",
    "choose",
    "class_named_like",
    "defined_classes",
    "misfit",
    "module_alone_allowed",
    "registered",
    "style_named",
    "style_names",
]


_MISSING: Final = object()


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
    """What a style's :meth:`Style.load` hands the handler process: the handler, and whether it
    must be awaited (decided once, at load time).

    ``func`` is always called as ABEJA's ``handler(request, context)``. For the ``abeja`` style
    it is the user's function, returning ABEJA's result dict; other styles' adapters wrap the
    user's code and return an :class:`~abeja_runtime.encode.EncodedResponse` (the other
    platform's answer, encoded once); ``style`` says which one.
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

    #: The name ``--style`` takes, as :data:`REGISTERED` lists it.
    name: str = ""
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

    def options_in(self, config: Config) -> Any:
        """This style's options: as ``config`` sets them, else their defaults; None for a style
        without any."""
        options = config.style_options.get(self.name)
        if options is None and self.options is not None:
            options = self.options()
        return options

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


def _imported(listed: Listed) -> Style:
    style: Style = importlib.import_module(f"{__name__}.{listed.module}").STYLE
    return style


@functools.cache
def registered() -> tuple[Style, ...]:
    """Every style, imported, in :data:`REGISTERED`'s order."""
    return tuple(_imported(listed) for listed in REGISTERED)


def style_named(name: str) -> Style:
    """The style called ``name``; only its own module is imported."""
    for listed in REGISTERED:
        if listed.name == name:
            return _imported(listed)
    raise ValueError(f"style must be one of {', '.join(style_names())}, got {name!r}")


def module_alone_allowed(style: str) -> bool:
    """Whether HANDLER may name a module alone with ``style`` (``auto``: if a style takes it).
    Imports the style (every style, for ``auto``)."""
    if style == "auto":
        return any(candidate.module_only for candidate in registered())
    return style_named(style).module_only


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
