"""The pixel limit of decoded images: a few KiB of PNG must not take gigabytes to decode.

A 136 KiB PNG of 12000 x 12000 pixels decodes to 432 MB of RGB (and more on the way). Pillow
checks an image's size when it opens it, before decoding: above ``MAX_IMAGE_PIXELS`` it warns
(``DecompressionBombWarning``), above twice that it raises ``DecompressionBombError``. A process
that serves handlers sets the limit to ``--max-image-pixels`` and makes the warning an error,
so that the runtime's own decoding (the v1 style), the samples and the templates, and any
handler that opens images with Pillow, stop at the limit as written; ``worker/invoke.py`` answers
either exception with ``413``. The limit is set when Pillow is first imported, whoever imports
it and whenever: a handler that never opens an image never loads Pillow.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType
from typing import Final

__all__ = ["is_image_bomb", "limit_image_pixels"]

_BOMBS: Final = frozenset({"DecompressionBombError", "DecompressionBombWarning"})
_IMAGE_MODULE: Final = "PIL.Image"


def limit_image_pixels(limit: int) -> None:
    """Images above ``limit`` pixels fail to open (0: Pillow checks nothing).

    The limit is set on ``PIL.Image`` the moment anything imports it (the handler, a library,
    the runtime's own decoding), by an import hook, not by importing Pillow here: a process
    whose handler never opens an image does not load Pillow (2 MiB and 8 ms each).
    """
    image = sys.modules.get(_IMAGE_MODULE)
    if image is not None:
        _apply(image, limit)
    else:
        sys.meta_path.insert(0, _LimitOnImport(limit))


def _apply(image: ModuleType, limit: int) -> None:
    vars(image)["MAX_IMAGE_PIXELS"] = limit or None
    if limit:
        warnings.simplefilter("error", image.DecompressionBombWarning)


class _LimitOnImport(importlib.abc.MetaPathFinder):
    """Finds ``PIL.Image`` as the other finders would, and sets the limit once its module has
    run, before the importer gets it; then it leaves ``sys.meta_path``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _IMAGE_MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _LimitingLoader(spec.loader, self._limit)
                return spec
        return None


class _LimitingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, limit: int) -> None:
        self._loader = loader
        self._limit = limit

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _apply(module, self._limit)

    def __getattr__(self, name: str) -> object:
        """The rest (``get_source`` for tracebacks, resource readers) is the real loader's."""
        return getattr(self._loader, name)


def is_image_bomb(exc: BaseException) -> bool:
    """Whether ``exc`` is Pillow's refusal of an image above the limit (no Pillow import)."""
    kind = type(exc)
    return kind.__name__ in _BOMBS and kind.__module__ == "PIL.Image"
