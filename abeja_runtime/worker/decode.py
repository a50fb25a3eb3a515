"""HTTP request parts → :class:`~abeja_runtime.worker.request.Request`, in a handler process.

The method, the raw target, the headers and the whole body as a file (the front checked the
method and the size). Multipart bodies are parsed a piece at a time (``multipart``'s sans-IO
parser), each part spooled to disk above the spool threshold. Every problem is raised as an
:class:`~abeja_runtime.errors.HttpError` subclass; nothing here writes a response.
"""

from __future__ import annotations

import io
import posixpath
import re
import urllib.parse
from collections.abc import Iterable
from typing import IO, Final

import multipart
from multidict import MultiDict, MultiDictProxy

from abeja_runtime.errors import BadRequest, TooManyParts
from abeja_runtime.limits import BodyLimits
from abeja_runtime.spool import Scratch, Spool
from abeja_runtime.worker.request import Content, Request

__all__ = ["decode_request"]

#: Credentials never reach user code (ABEJA's docs promise it; its proxy forgot).
_STRIPPED_HEADERS: Final = frozenset({"authorization", "proxy-authorization"})
_GET_CONTENT_TYPE: Final = "application/x-www-form-urlencoded"
_DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"
#: Part header limits: generous for real forms, small enough to stop a header flood in a part.
_MAX_PART_HEADER_SIZE: Final = 16 * 1024
_MAX_PART_HEADER_COUNT: Final = 32
_NO_QUERY: Final[MultiDictProxy[str]] = MultiDictProxy(MultiDict())
#: C0 controls and DEL: no file name carries them honestly.
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


def decode_request(
    *,
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Iterable[tuple[str, str]],
    body: IO[bytes],
    limits: BodyLimits,
    request_id: str = "",
) -> Request:
    """Build the handler's request; raise ``HttpError`` subclasses for anything malformed.
    ``body`` (the whole body: in memory, or the front's spool file) becomes the request's own,
    as it is, unless it is multipart, whose parts are parsed from it and spooled on their own."""
    kept = []
    content_type = None
    for name, value in headers:
        lower = name.lower()
        if lower not in _STRIPPED_HEADERS:
            kept.append((name, value))
            if content_type is None and lower == "content-type":
                content_type = value
    path = _unquote_path(raw_path) if "%" in raw_path else raw_path
    query = _parse_query(raw_query) if raw_query else _NO_QUERY
    scratch = None  # made for a multipart body's parts only
    try:
        if method == "GET":
            body.close()
            content_type = _GET_CONTENT_TYPE
            contents = [Content(io.BytesIO(raw_query.encode("utf-8", "surrogateescape")))]
        else:
            content_type = content_type or _DEFAULT_CONTENT_TYPE
            if content_type[:19].lower() == "multipart/form-data":
                mime, options = multipart.parse_options_header(content_type)
            else:
                mime, options = "", {}
            if mime == "multipart/form-data":
                scratch = Scratch()
                with body:
                    contents = _read_multipart(body, options.get("boundary"), limits, scratch)
            else:
                contents = [Content(body)]
    except BaseException:
        body.close()
        if scratch is not None:
            scratch.remove()
        raise
    return Request(
        http_method=method,
        content_type=content_type,
        headers=kept,
        contents=contents,
        path=path,
        query=query,
        query_string=raw_query,
        request_id=request_id,
        scratch=scratch,
    )


def _unquote_path(raw_path: str) -> str:
    try:
        return urllib.parse.unquote(raw_path, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("the URL path is not valid percent-encoded UTF-8") from None


def _parse_query(raw_query: str) -> MultiDictProxy[str]:
    try:
        pairs = urllib.parse.parse_qsl(raw_query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid percent-encoded UTF-8") from None
    return MultiDictProxy(MultiDict(pairs))


#: How much of a spooled multipart body is parsed at a time.
_PARSE_CHUNK: Final = 256 * 1024


def _read_multipart(
    body: IO[bytes], boundary: str | None, limits: BodyLimits, scratch: Scratch
) -> list[Content]:
    if not boundary:
        raise BadRequest(
            "multipart/form-data request has no boundary parameter in its Content-Type header; "
            "let your HTTP library build the header (e.g. 'multipart/form-data; boundary=...')"
        )
    parser = multipart.PushMultipartParser(
        boundary,
        max_header_size=_MAX_PART_HEADER_SIZE,
        max_header_count=_MAX_PART_HEADER_COUNT,
    )
    contents: list[Content] = []
    spool: Spool | None = None
    segment: multipart.MultipartSegment | None = None
    try:
        while True:
            chunk = body.read(_PARSE_CHUNK)
            for event in parser.parse(chunk):  # b"" at the end: a truncated body raises here
                if isinstance(event, multipart.MultipartSegment):
                    if limits.max_parts and len(contents) >= limits.max_parts:
                        raise TooManyParts(limits.max_parts)
                    segment, spool = event, Spool(scratch, limits.spool_threshold)
                elif event is None:
                    assert segment is not None and spool is not None
                    contents.append(_part_content(segment, spool))
                    segment = spool = None
                else:
                    assert spool is not None
                    spool.write(event)
            if not chunk:
                break
        parser.close()
    except multipart.MultipartError as exc:
        _discard(contents, spool)
        raise BadRequest(f"malformed multipart/form-data body: {exc}") from None
    except BaseException:
        _discard(contents, spool)
        raise
    return contents


def _part_content(segment: multipart.MultipartSegment, spool: Spool) -> Content:
    # The base name only, whichever separator the client used ("../../etc/cat.jpg" → "cat.jpg");
    # a name with no base name or one that means a directory ("", ".", "..", "dir/") → None, so
    # that a handler joining it to a folder never leaves that folder.
    # A name with a control character (a NUL cuts a C string short: "a\x00.py") → None too.
    file_name: str | None = posixpath.basename((segment.filename or "").replace("\\", "/"))
    if file_name in ("", ".", "..") or _CONTROL.search(file_name or ""):
        file_name = None
    return Content(
        spool.finish(),
        content_type=segment.header("Content-Type") or None,
        file_name=file_name,
        form_name=segment.name or None,
    )


def _discard(contents: list[Content], spool: Spool | None) -> None:
    for content in contents:
        content.close()
    if spool is not None:
        spool.discard()
