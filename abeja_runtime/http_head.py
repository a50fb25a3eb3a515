"""An HTTP/1.1 answer's head as the runtime writes it, on the front's direct path
(``front/answers.py``) and in a handler process that writes a streamed answer to its client
itself (``worker/client_streams.py``).

An answer's head follows the same rules on every path: the handler's headers as it gave them,
then the request id (:data:`~abeja_runtime.logs.REQUEST_ID_HEADER`), the framing
(``Content-Length``, or ``Transfer-Encoding: chunked`` for a streamed answer; none for the
statuses without a body, 1xx, 204 and 304, as aiohttp sends them), ``Date``, ``Server``, and
``Connection: close`` when the connection ends with it. A head the client could misread (a
header holding a line break, which would split the answer, or another control character) is
refused (``ValueError``): the answer becomes the runtime's own ``500``.
"""

from __future__ import annotations

import functools
import http
import re
import sys
import time
from typing import Final

from abeja_runtime.logs import REQUEST_ID_HEADER

__all__ = [
    "EMPTY_BODY_STATUSES", "LAST_CHUNK", "Headers", "answer_head", "checked_head", "chunk",
    "server_line",
]  # fmt: skip

Headers = tuple[tuple[str, str], ...]

#: Statuses whose answers have no body, and no Content-Length (as aiohttp sends them).
EMPTY_BODY_STATUSES: Final = frozenset((204, 304, *range(100, 200)))
#: What a header must not hold besides its line's end (aiohttp refuses the same in names
#: and values, and line breaks: header injection).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: A chunked body's end.
LAST_CHUNK: Final = b"0\r\n\r\n"


def answer_head(
    status: int, headers: Headers, request_id: str, length: int | None, *, close: bool
) -> bytes:
    """The status line and headers of an answer (the module's docstring lists them), with a
    body of ``length`` bytes, or chunked (``None``). ``ValueError`` for a header that would
    split the answer or cannot be encoded (:func:`checked_head`; the request id cannot:
    :func:`~abeja_runtime.logs.request_id_from` made sure)."""
    if status in EMPTY_BODY_STATUSES:
        framing = ""
    elif length is None:
        framing = "Transfer-Encoding: chunked\r\n"
    else:
        framing = f"Content-Length: {length}\r\n"
    date = f"Date: {_http_date(int(time.time()))}\r\n"
    end = "Connection: close\r\n\r\n" if close else "\r\n"
    return (
        f"{checked_head(status, headers)}{REQUEST_ID_HEADER}: {request_id}\r\n"
        f"{framing}{date}{server_line()}{end}"
    ).encode()


@functools.lru_cache(maxsize=256)
def checked_head(status: int, headers: Headers) -> str:
    """The status line and the handler's headers, checked (``ValueError`` for a line break or
    another control character, or text that cannot be encoded): a handler answers with the
    same few sets of headers, so each is written and scanned once."""
    lines = [f"HTTP/1.1 {status} {_reason(status)}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers]
    given = "".join(lines)
    # One line each, and no other control character: three scans of the whole text instead
    # of two per header.
    ends = len(lines)
    if given.count("\n") != ends or given.count("\r") != ends or _CONTROL.search(given):
        raise ValueError("a header holds a line break or a control character")
    given.encode()  # UnicodeEncodeError, a ValueError, for a lone surrogate
    return given


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


_DAYS: Final = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS: Final = (
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
)  # fmt: skip


@functools.lru_cache(maxsize=2)
def _http_date(second: int) -> str:
    """RFC 9110's date of ``second`` (as ``email.utils.formatdate(usegmt=True)``, without
    importing ``email``, and in English whatever the locale)."""
    t = time.gmtime(second)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


@functools.cache
def server_line() -> str:
    """The ``Server`` header aiohttp writes on its own answers (``aiohttp.http.SERVER_SOFTWARE``):
    the front's aiohttp's own; in a handler process that writes its streams, made from aiohttp's
    version without importing it (its import would cost the process a tenth of a second and
    18 MiB), or imported where its package has no metadata (vendored)."""
    loaded = sys.modules.get("aiohttp.http")
    if loaded is not None:
        return f"Server: {loaded.SERVER_SOFTWARE}\r\n"
    import importlib.metadata  # (once: not every process writes an answer)

    try:
        version = importlib.metadata.version("aiohttp")
    except importlib.metadata.PackageNotFoundError:
        from aiohttp.http import SERVER_SOFTWARE

        return f"Server: {SERVER_SOFTWARE}\r\n"
    python = sys.version_info
    return f"Server: Python/{python[0]}.{python[1]} aiohttp/{version}\r\n"


@functools.cache
def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""
