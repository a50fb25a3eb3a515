"""The styles as ``--style`` lists them (:data:`REGISTERED`), without importing any: what the
settings (:mod:`abeja_runtime.config`) take the choices and help of ``--style`` from. The styles
themselves, and the contract between them and the handler process, are
:mod:`abeja_runtime.styles`."""

from __future__ import annotations

from typing import Final, NamedTuple

__all__ = ["REGISTERED", "Listed", "style_names"]


class Listed(NamedTuple):
    """A style as :data:`REGISTERED` lists it, without importing it."""

    #: What ``--style`` takes; the ``name`` of its ``STYLE``.
    name: str
    #: The module (or package) of :mod:`abeja_runtime.styles` that defines ``STYLE``.
    module: str
    #: What it serves, a few words for ``--style``'s help.
    summary: str


#: The styles, in the order ``auto`` tries them: the first whose ``Style.detect`` recognises
#: what HANDLER names serves it (:mod:`abeja_runtime.styles`); ``abeja``, last, takes what no
#: other does. A static table, so that ``--style``'s choices and help cost no import (a test
#: checks it against the styles themselves).
REGISTERED: Final = (
    Listed("abeja-v1", "abeja_v1", "18.10 generator handlers"),
    Listed("cortex", "cortex", "pre_inference/post_inference + ONNX model"),
    Listed("kserve", "kserve", "kserve.Model class"),
    Listed("seldon", "seldon", "class with predict"),
    Listed("openai", "openai", "chat/complete/embed functions as OpenAI's API"),
    Listed("abeja", "abeja", "handler(request, context)"),
)


def style_names() -> tuple[str, ...]:
    """What ``--style`` takes: ``auto`` and each style's name (no style is imported)."""
    return ("auto", *(listed.name for listed in REGISTERED))
