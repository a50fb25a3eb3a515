"""aiohttp for the front process: its server half at once, its client half only when used.

``import aiohttp.web`` first runs ``aiohttp/__init__.py``, which imports aiohttp's whole HTTP
client (the connector, whose SSL contexts load the system's CA bundle, cookies, tracing, happy
eyeballs): 4 MiB of the front's memory for a client it uses only to send the results of ABEJA's
async requests (:mod:`.async_jobs`), which most deployments never receive.

:func:`install` puts into ``sys.modules`` the ``aiohttp`` package as the import system would make
it, and its ``__version__`` (``aiohttp.http`` needs it for the ``Server`` header), without running
its ``__init__``: ``aiohttp.web`` and every other submodule import as usual. The first lookup of
any other name (``aiohttp.ClientSession``...) runs the real ``__init__`` into that same module,
once. Only the front calls it (``abeja_runtime.main``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from importlib.abc import Loader
from types import ModuleType
from typing import Final

__all__ = ["install"]

_PACKAGE: Final = "aiohttp"
#: The first line of ``aiohttp/__init__.py``; without it the package is imported whole.
_VERSION: Final = re.compile(rb'^__version__ = "([^"]+)"$', re.MULTILINE)


def install() -> None:
    """Make ``aiohttp`` a package whose ``__init__`` runs on first use; a no-op once imported."""
    if _PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or spec.origin is None or spec.loader is None:
        return  # not installed: the front's own import of it says so
    with open(spec.origin, "rb") as init:
        version = _VERSION.search(init.read())
    if version is None:
        return  # an aiohttp laid out otherwise: nothing is deferred
    package = importlib.util.module_from_spec(spec)
    package.__version__ = version.group(1).decode()  # type: ignore[attr-defined]
    vars(package)["__getattr__"] = _loader_on_use(package, spec.loader)
    sys.modules[_PACKAGE] = package


def _loader_on_use(package: ModuleType, loader: Loader) -> object:
    """The package's ``__getattr__`` until its ``__init__`` has run (which defines its own)."""

    def __getattr__(name: str) -> object:
        submodule = f"{_PACKAGE}.{name}"
        if importlib.util.find_spec(submodule) is not None:
            return importlib.import_module(submodule)  # ``from aiohttp import web``
        if vars(package).get("__getattr__") is __getattr__:
            del vars(package)["__getattr__"]  # the real one, or none, from here on
            loader.exec_module(package)
        return getattr(package, name)

    return __getattr__
