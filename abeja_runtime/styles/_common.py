"""What every adapter needs: encoded answers, bodies, headers, optional imports.

Adapters answer with encoded responses (:func:`json_result`, :func:`text_result`), not ABEJA
result dicts: the runtime's own serialisation rules (a list becomes JSON Lines) never reshape
another platform's JSON document, and no answer is built twice.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Coroutine, Mapping
from types import ModuleType
from typing import Any, Final

from abeja_runtime.encode import EncodedResponse, encoded_reply, json_dumps
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.worker.request import Request

__all__ = [
    "JSON",
    "BodyNotJson",
    "finish_now",
    "header_dict",
    "json_result",
    "media_type",
    "parse_json",
    "read_body",
    "require",
    "text_result",
]

JSON: Final = "application/json"
_TEXT: Final = "text/plain; charset=utf-8"


class BodyNotJson(ValueError):
    """The request body is not valid JSON (the text says where)."""


def json_result(
    value: Any,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
    content_type: str = JSON,
) -> EncodedResponse:
    """One JSON document (numpy values included), whatever the value's type."""
    return encoded_reply(
        json_dumps(value), content_type=content_type, status=status, metadata=headers
    )


def text_result(
    text: str | bytes,
    status: int = 200,
    content_type: str = _TEXT,
    headers: Mapping[str, str] | None = None,
) -> EncodedResponse:
    """A body that is sent as it is (str in the content type's charset)."""
    return encoded_reply(text, content_type=content_type, status=status, metadata=headers)


def read_body(request: Request) -> bytes:
    """The whole first body; empty when the request has none."""
    try:
        return request.read()
    except ValueError:  # the request has no body at all
        return b""


def parse_json(body: bytes) -> Any:
    """Parse a JSON body; :class:`BodyNotJson` with the parser's message when it is not JSON."""
    try:
        return json.loads(body)
    except RecursionError:
        raise BodyNotJson("it is nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, or a number of more than 4,300 digits
        raise BodyNotJson(str(exc)) from None


def media_type(content_type: str | None) -> str:
    """``'Application/JSON; charset=utf-8'`` → ``'application/json'``."""
    return (content_type or "").partition(";")[0].strip().lower()


def header_dict(request: Request) -> dict[str, str]:
    """Request headers as a plain, mutable dict with lower-case names (last value wins)."""
    return dict(request["http_headers"].items())


def require(module: str, style: str, package: str | None = None) -> ModuleType:
    """Import an optional dependency of a style, or say which package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise HandlerLoadError(
            f"the {style} style needs the {package or module} package, which cannot be "
            f"imported ({exc}); add it to requirements.txt or pip install {package or module}"
        ) from exc


def finish_now(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (kserve's async plumbing around sync user methods)."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise RuntimeError(
        "the KServe model waited on the event loop although its methods are plain functions; "
        "make its methods async def"
    )
