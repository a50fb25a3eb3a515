"""ABEJA Platform v1 handlers (the 18.10 images, ``run-local --v1``).

The first generation called ``handler(iterable, context)`` with an iterable of *decoded*
inputs and took what the handler yielded as the answer::

    def handler(_iter, ctx):
        for img in _iter:                     # a numpy array for a JPEG/PNG body
            yield {"result": classify(img)}

ABEJA's public samples are still written this way. Each body of the request (the body, or each
multipart part) is decoded by its media type: JSON into Python objects, images into RGB numpy
arrays (Pillow), anything else stays bytes. One yielded object is the response's JSON document;
several are sent as JSON Lines, one object per line, as the v1 runtime did.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, encoded_reply, json_dumps, status_reply
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.styles._common import JSON, BodyNotJson, media_type, parse_json, require
from abeja_runtime.worker.request import Request

__all__ = ["adapt"]

#: Media types decoded into numpy arrays; Pillow reads them all.
_IMAGE_TYPES: Final = frozenset(
    {"image/jpeg", "image/jpg", "image/png", "image/gif", "image/bmp", "image/webp", "image/tiff"}
)


class _UndecodableBody(ValueError):
    """A body whose media type promises JSON or an image, but whose bytes are not one."""


def adapt(func: Callable[..., Any], *, config: Config, workdir: Path) -> LoadedHandler:
    """Wrap a v1 generator handler; numpy and Pillow are needed to decode images."""
    numpy = require("numpy", "abeja-v1")
    image = require("PIL.Image", "abeja-v1", "Pillow")
    decode = _Decoder(numpy, image)
    if inspect.isasyncgenfunction(func) or inspect.iscoroutinefunction(func):

        async def async_handler(request: Request, context: dict[str, Any]) -> EncodedResponse:
            try:
                inputs = decode.all(request)
            except _UndecodableBody as exc:
                return _bad_request(str(exc))
            produced = func(iter(inputs), context)
            if inspect.isawaitable(produced):
                produced = await produced
            if hasattr(produced, "__aiter__"):
                return _answer([item async for item in produced])
            return _answer(list(produced or ()))

        return LoadedHandler(async_handler, is_async=True, name=config.handler, style="abeja-v1")

    def handler(request: Request, context: dict[str, Any]) -> EncodedResponse:
        try:
            inputs = decode.all(request)
        except _UndecodableBody as exc:
            return _bad_request(str(exc))
        return _answer(list(func(iter(inputs), context) or ()))

    return LoadedHandler(handler, is_async=False, name=config.handler, style="abeja-v1")


class _Decoder:
    """Turns each body of a request into what a v1 handler iterates over."""

    def __init__(self, numpy: Any, image: Any) -> None:
        self._numpy = numpy
        self._image = image

    def all(self, request: Request) -> list[Any]:
        contents = request["contents"]
        if request["http_method"] == "GET":
            return [content.read() for content in contents]  # the raw query, as bytes
        return [
            self.one(content.read(), content["content_type"] or request["content_type"])
            for content in contents
        ]

    def one(self, body: bytes, content_type: str) -> Any:
        mime = media_type(content_type)
        if mime == JSON or mime.endswith("+json"):
            try:
                return parse_json(body)
            except BodyNotJson as exc:
                raise _UndecodableBody(f"the {mime} body is not valid JSON: {exc}") from None
        if mime in _IMAGE_TYPES:
            try:
                with self._image.open(io.BytesIO(body)) as picture:
                    return self._numpy.asarray(picture.convert("RGB"))
            except (OSError, ValueError) as exc:
                raise _UndecodableBody(f"the {mime} body is not a readable image: {exc}") from None
        return body


def _answer(results: Iterable[Any]) -> EncodedResponse:
    """One result → one JSON document; several → JSON Lines; none → an empty body."""
    return encoded_reply("\n".join(json_dumps(result) for result in results), content_type=JSON)


def _bad_request(message: str) -> EncodedResponse:
    return status_reply(400, message)
