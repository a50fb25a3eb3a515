"""The handler's return value → status, headers and body bytes or a stream of byte chunks.

The rules are ABEJA's (contract Part B 5.1) with the fixes of contract A3: ``content`` is
normalised into a sequence of *elements*; each element is encoded by one small function chosen by
its kind, with ABEJA's separators (JSON and text elements are lines, each preceded by a newline
once anything was written; bytes are appended raw). In-memory content is rendered at once, so the
response gets a ``Content-Length``; generators, iterators and file objects are encoded lazily,
one element or chunk at a time, and streamed, each line then ending with its own newline (a
client reading lines has every item as it is sent). Sending the bytes is the server's job.
"""

from __future__ import annotations

import codecs
import functools
import http
import io
import json
import logging
import re
import sys
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sized,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.errors import HandlerResultError, HttpError

if TYPE_CHECKING:
    import csv

__all__ = [
    "UNEXPECTED_ERROR",
    "EncodedResponse",
    "encode_result",
    "encoded_reply",
    "json_dumps",
    "status_body",
    "status_reply",
    "word_errors_for",
]

_log = logging.getLogger("abeja_runtime")

DEFAULT_CONTENT_TYPE: Final = "text/plain"
_JSON: Final = "application/json"
#: Headers that describe the message framing; a handler's metadata cannot override them.
_PROTECTED_HEADERS: Final = frozenset(
    {"content-type", "content-length", "connection", "transfer-encoding"}
)
_HEADER_NAME: Final = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_FORBIDDEN_IN_VALUE: Final = re.compile(r"[\r\n\x00]")
_BYTES_LIKE: Final = (bytes, bytearray, memoryview)
#: Read size for streamed file objects: large enough to keep syscalls few, small enough that a
#: streamed response never holds much memory.
_FILE_CHUNK: Final = 64 * 1024

#: In memory; streamed as it is produced (on a handler thread); or streamed to the loop.
Body = bytes | Iterator[bytes] | AsyncIterator[bytes]


@dataclass(frozen=True, slots=True)
class EncodedResponse:
    """What the server sends: ``body`` is bytes, or an iterator for a streamed response.

    The one shape of every answer: the handler's result once encoded, a style's own answer, and
    every error the runtime gives itself (:func:`status_reply`).
    """

    status: int
    headers: tuple[tuple[str, str], ...]
    body: Body

    def header(self, name: str, default: str = "") -> str:
        """The value of the header ``name`` (any case), or ``default``."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), default)

    def with_headers(self, extra: tuple[tuple[str, str], ...]) -> EncodedResponse:
        """The same response with ``extra`` headers, which win over those of the same name."""
        if not extra:
            return self
        names = {name.lower() for name, _ in extra}
        kept = tuple(header for header in self.headers if header[0].lower() not in names)
        return EncodedResponse(self.status, kept + extra, self.body)


def status_reply(
    status: int, message: str, headers: Iterable[tuple[str, str]] = ()
) -> EncodedResponse:
    """The one shape of every error the runtime answers itself: ``{"status": message}`` JSON."""
    return EncodedResponse(status, (("Content-Type", _JSON), *headers), status_body(message))


def error_reply(exc: HttpError) -> EncodedResponse:
    """The runtime's answer for ``exc``: its status, its message (in the served style's words,
    :func:`word_errors_for`), its headers."""
    body = _error_bodies(exc.status, exc.message)
    return EncodedResponse(exc.status, (("Content-Type", _JSON), *exc.headers.items()), body)


def _status_error(status: int, message: str) -> bytes:
    return status_body(message)


def _openai_error(status: int, message: str) -> bytes:
    """OpenAI's error object, which its clients read the message of."""
    error = {
        "message": message,
        "type": "invalid_request_error" if status < 500 else "server_error",
        "param": None,
        "code": "invalid_api_key" if status == 401 else None,
    }
    return json.dumps({"error": error}).encode()


#: The styles whose clients expect the runtime's own errors (a refused key, a full queue, a
#: timeout) in another shape than ABEJA's ``{"status": message}``.
_ERROR_BODIES: Final[dict[str, Callable[[int, str], bytes]]] = {"openai": _openai_error}
#: The body of an error as the style words it, kept for the messages that come again (a
#: refusal of a full queue, under a flood, is one message answered thousands of times).
_error_bodies = functools.lru_cache(maxsize=256)(_status_error)


def word_errors_for(style: str) -> None:
    """The errors this process answers from now on, in ``style``'s words: set once the handler
    is loaded (in its process) or the first worker is ready (in the front)."""
    global _error_bodies
    _error_bodies = functools.lru_cache(maxsize=256)(_ERROR_BODIES.get(style, _status_error))


def status_body(message: str) -> bytes:
    """The body of :func:`status_reply`, for the few answers written as raw bytes."""
    return json.dumps({"status": message}).encode()


def encoded_reply(
    body: str | bytes,
    *,
    content_type: str,
    status: int = 200,
    metadata: Mapping[str, object] | None = None,
) -> EncodedResponse:
    """An answer whose body is encoded already (a style's own JSON or text), without the ABEJA
    content rules; its status and headers are checked as a handler's are."""
    charset = _media_type(content_type)[1]
    data = body.encode(charset) if isinstance(body, str) else body
    return EncodedResponse(_status(status), _headers(content_type, metadata, ()), data)


def _json_default(value: object) -> Any:
    """Types ABEJA's encoder knew (datetime, numpy) plus those contract A3 adds."""
    # datetime and decimal are looked up, not imported: a value of theirs exists only where
    # they are loaded already, and a handler process need not load them (1 MiB) for others.
    dates = sys.modules.get("datetime")
    if dates is not None and isinstance(value, dates.date | dates.time):
        return value.isoformat()
    decimal = sys.modules.get("decimal")
    if decimal is not None and isinstance(value, decimal.Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return int(value)
        return float(value)
    if isinstance(value, set | frozenset):
        return list(value)
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # arrays, numpy integers, floats and bools
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


#: ABEJA's JSON: default separators, ASCII only, NaN allowed.
json_dumps: Callable[[Any], str] = json.JSONEncoder(default=_json_default).encode


def encode_result(
    result: object,
    *,
    extra_headers: Iterable[tuple[str, str]] = (),
    dumps: Callable[[Any], str] = json_dumps,
) -> EncodedResponse:
    """Check the handler's result against the contract and encode it.

    ``extra_headers`` (runtime version, ``X-Abeja-*``) are added last and win over metadata.
    A style adapter's answer (an :class:`EncodedResponse`) only gets them. Raises
    :class:`HandlerResultError` with a message for the handler's author.
    """
    if isinstance(result, EncodedResponse):
        return result.with_headers(tuple(extra_headers))
    if type(result) is not dict and not isinstance(result, Mapping):
        raise HandlerResultError(
            f"the handler returned {_describe(result)}, but it must return a dict such as "
            "{'status_code': 200, 'content_type': 'application/json', 'content': {...}}"
        )
    status = _status(result.get("status_code", http.HTTPStatus.OK))
    content_type = result.get("content_type", DEFAULT_CONTENT_TYPE)
    if not isinstance(content_type, str) or not content_type.strip():
        raise HandlerResultError(
            f"the handler returned content_type {content_type!r}; it must be a media type "
            "such as 'application/json' (leave the key out for text/plain)"
        )
    mime, charset = _media_type(content_type)
    headers = _headers(content_type, result.get("metadata"), extra_headers)
    if mime == _EVENT_STREAM:
        headers = _event_stream_headers(headers)
    body = _render(result.get("content"), _ElementWriter(mime, charset, dumps))
    return EncodedResponse(status, headers, body)


#: Server-Sent Events' media type, and the headers its answers get unless the handler set them:
#: no caching, and no buffering by proxies (nginx's ``X-Accel-Buffering``), so that each event
#: reaches the browser as it is sent.
_EVENT_STREAM: Final = "text/event-stream"
_EVENT_STREAM_HEADERS: Final = (("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"))


def _event_stream_headers(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    given = {name.lower() for name, _ in headers}
    missing = tuple(pair for pair in _EVENT_STREAM_HEADERS if pair[0].lower() not in given)
    return headers + missing


def _describe(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _status(value: object) -> int:
    if value is None:  # ABEJA Platform sends JSON null and the proxy falls back to 200
        return 200
    if isinstance(value, bool) or not isinstance(value, int) or not 200 <= value <= 599:
        # 1xx statuses are not answers: a client that gets one waits for the final one.
        raise HandlerResultError(
            f"the handler returned status_code {value!r}; it must be an int from 200 to 599, "
            "e.g. http.HTTPStatus.OK"
        )
    return int(value)


@functools.lru_cache(maxsize=256)
def _media_type(content_type: str) -> tuple[str, str]:
    if _FORBIDDEN_IN_VALUE.search(content_type):
        raise HandlerResultError(f"the handler's content_type {content_type!r} has a line break")
    # Imported here: only handler processes use it; the front, which imports this module, never.
    import multipart

    mime, options = multipart.parse_options_header(content_type)
    charset = options.get("charset") or "utf-8"
    try:
        charset = codecs.lookup(charset).name
    except LookupError:
        raise HandlerResultError(
            f"the handler's content_type {content_type!r} names the unknown charset {charset!r}; "
            "use a standard one such as utf-8"
        ) from None
    return mime, charset


def _headers(
    content_type: str, metadata: object, extra: Iterable[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    if metadata is None and isinstance(extra, tuple):  # the common case, the same every time
        return _headers_without_metadata(content_type, extra)
    headers: dict[str, tuple[str, str]] = {"content-type": ("Content-Type", content_type)}
    if metadata is not None and not isinstance(metadata, Mapping):
        raise HandlerResultError(
            f"the handler returned metadata of type {type(metadata).__name__}; it must be a dict "
            "of header names to values"
        )
    for name, value in (metadata or {}).items():
        if not isinstance(name, str) or not _HEADER_NAME.match(name):
            raise HandlerResultError(
                f"metadata key {name!r} is not a valid HTTP header name (letters, digits, '-')"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise HandlerResultError(
                f"metadata value for {name!r} is {_describe(value)}; use a string or a number"
            )
        text = str(value)
        if _FORBIDDEN_IN_VALUE.search(text):
            raise HandlerResultError(f"metadata value for {name!r} contains a line break")
        if name.lower() in _PROTECTED_HEADERS:
            _warn_protected(name.lower())
            continue
        headers[name.lower()] = (name, text)
    for name, value in extra:
        headers[name.lower()] = (name, value)
    return tuple(headers.values())


@functools.lru_cache(maxsize=64)
def _headers_without_metadata(
    content_type: str, extra: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    return _headers(content_type, {}, extra)


@functools.cache
def _warn_protected(name: str) -> None:
    """Log once per header name: the handler keeps trying, the log should not fill up."""
    _log.warning(
        "the handler's metadata sets %s, which the runtime controls; the value is ignored "
        "(set content_type in the returned dict instead)",
        name,
    )


class _ElementWriter:
    """Encodes content elements one by one with ABEJA's separator rules: JSON and text elements
    are lines, bytes, CSV rows and Server-Sent Events are written as they are."""

    __slots__ = ("_charset", "_csv", "_csv_buffer", "_dumps", "_mime", "_wrote")

    def __init__(self, mime: str, charset: str, dumps: Callable[[Any], str]) -> None:
        self._mime = mime
        self._charset = charset
        self._dumps = dumps
        self._wrote = False
        self._csv: csv.DictWriter[str] | None = None
        self._csv_buffer: io.StringIO | None = None  # made for the first CSV row

    def encode(self, element: object) -> bytes:
        """An element of content held in memory: a line is preceded by a newline once anything
        was written (``{"a": 1}\\n{"b": 2}``, as ABEJA Platform wrote it)."""
        out, is_line = self._encoded(element)
        if is_line and self._wrote:
            out = b"\n" + out
        self._wrote = self._wrote or bool(out)
        return out

    def encode_streamed(self, element: object) -> bytes:
        """An item of a streamed answer: a line ends with its newline, so that a client that
        reads lines (``curl -N``, ``requests.iter_lines()``) has each item as it is sent,
        rather than once the next one comes."""
        out, is_line = self._encoded(element)
        return out + b"\n" if is_line else out

    def _encoded(self, element: object) -> tuple[bytes, bool]:
        """The element's bytes, and whether it is a line (JSON or text)."""
        if isinstance(element, _BYTES_LIKE):
            return bytes(element), False
        if self._mime == _EVENT_STREAM:
            return self._event(element), False
        if isinstance(element, str):
            return self.text(element), True
        if self._mime == "text/csv":
            return self._csv_row(element), False
        try:
            return self._dumps(_pairs_to_dict(element)).encode("ascii"), True
        except (TypeError, ValueError) as exc:
            raise HandlerResultError(f"the handler's content cannot be encoded: {exc}") from exc

    def text(self, value: str) -> bytes:
        try:
            return value.encode(self._charset)
        except UnicodeEncodeError as exc:
            raise HandlerResultError(
                f"the handler's text cannot be encoded as {self._charset}: {exc}"
            ) from exc

    def _event(self, element: object) -> bytes:
        """Server-Sent Events: a string as written (the handler's own ``data:`` lines), any
        other element as one ``data:`` event holding its JSON."""
        if isinstance(element, str):
            return self.text(element)
        try:
            data = self._dumps(_pairs_to_dict(element))
        except (TypeError, ValueError) as exc:
            raise HandlerResultError(f"the handler's content cannot be encoded: {exc}") from exc
        return f"data: {data}\n\n".encode("ascii")

    def _csv_row(self, row: object) -> bytes:
        if not isinstance(row, Mapping):
            raise HandlerResultError(
                f"text/csv content must be dicts, one per row (or a str); got {_describe(row)}"
            )
        if self._csv is None or self._csv_buffer is None:
            import csv  # only for CSV answers

            self._csv_buffer = io.StringIO()
            self._csv = csv.DictWriter(self._csv_buffer, fieldnames=list(row))
            self._csv.writeheader()
        try:
            self._csv.writerow(row)
        except ValueError as exc:
            raise HandlerResultError(f"a text/csv row does not match the first row: {exc}") from exc
        text = self._csv_buffer.getvalue()
        self._csv_buffer.seek(0)
        self._csv_buffer.truncate()
        return self.text(text)


def _pairs_to_dict(element: object) -> object:
    """ABEJA Platform turns a list of key/value tuples into an object: ``[('a', 1)]`` →
    ``{"a": 1}``."""
    if (
        isinstance(element, list)
        and element
        and all(isinstance(item, tuple) and len(item) == 2 for item in element)
    ):
        return dict(element)
    return element


def _render(content: object, writer: _ElementWriter) -> Body:
    """Dispatch on the kind of content; see the table in the README."""
    if content is None:
        return b""
    if isinstance(content, _BYTES_LIKE):
        return bytes(content)  # raw: contract A3 (ABEJA Platform sent decimal byte values)
    if type(content) is dict or isinstance(content, str | Mapping):
        return writer.encode(content)
    if type(content).__module__ == "numpy" and hasattr(content, "tolist"):
        content = content.tolist()  # an array is encoded like the list it holds
        if not isinstance(content, list):
            return writer.encode(content)
    return _render_many(content, writer)


def _render_many(content: object, writer: _ElementWriter) -> Body:
    """:func:`_render` for content that holds many pieces: a file, an iterable of elements."""
    if isinstance(content, io.BytesIO):
        return content.read()
    if isinstance(content, io.StringIO):
        return writer.text(content.read())
    if callable(getattr(content, "read", None)):
        return _stream_file(content, writer)
    if isinstance(content, AsyncIterable):  # an async generator: streamed as it yields
        return _stream_async_elements(content, writer)
    if isinstance(content, Iterable):
        if isinstance(content, Sized):  # list, tuple, set...: in memory, render now
            return b"".join(writer.encode(element) for element in content)
        return _stream_elements(content, writer)
    return writer.encode(content)  # numbers, booleans, datetimes, numpy scalars...


def _stream_elements(elements: Iterable[object], writer: _ElementWriter) -> Iterator[bytes]:
    iterator = iter(elements)
    try:
        for element in iterator:
            chunk = writer.encode_streamed(element)
            if chunk:
                yield chunk
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()


async def _stream_async_elements(
    elements: AsyncIterable[object], writer: _ElementWriter
) -> AsyncIterator[bytes]:
    iterator = aiter(elements)
    try:
        async for element in iterator:
            chunk = writer.encode_streamed(element)
            if chunk:
                yield chunk
    finally:
        aclose = getattr(iterator, "aclose", None)
        if callable(aclose):
            await aclose()


def _stream_file(file: Any, writer: _ElementWriter) -> Iterator[bytes]:
    try:
        while chunk := file.read(_FILE_CHUNK):
            yield writer.text(chunk) if isinstance(chunk, str) else bytes(chunk)
    finally:
        file.close()


#: The answer when the handler raised: the one object, so that callers can tell it apart.
UNEXPECTED_ERROR: Final = status_reply(500, "unexpected error occurred")
