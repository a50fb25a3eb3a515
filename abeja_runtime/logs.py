"""Logging: runtime messages, one access record per request, the handler's prints.

JSON lines by default. Field names follow ABEJA's proxy (contract Part B 6.1): ``log_level``,
``message``, ``timestamp``, ``version``, ``request_id``/``requester_id`` while a request runs, and
platform ids from the environment. Access records carry ``log_type: access_log`` and no
``message``. Lines the handler prints become ``info`` (stdout) or ``warning`` (stderr) records
with the request id of the call that printed them, because the id lives in a ``ContextVar`` that
follows the call into its handler thread.

For a person at a terminal (``--log-format text``, or ``auto`` on a TTY) the same records are
readable lines instead (:class:`TextFormatter`): the platform's ids, the same on every line, are
left out, and a traceback is printed as Python prints it.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import random
import sys
import threading
import time
import traceback
import types
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any, Final, TextIO, TypeGuard, cast

from abeja_runtime import __version__

__all__ = [
    "MAX_REQUEST_ID",
    "REQUESTER_ID_HEADER",
    "REQUEST_ID_HEADER",
    "access_logger",
    "capture_prints",
    "configure_logging",
    "encode_record",
    "format_timestamp",
    "logs_text",
    "new_request_id",
    "request_id_from",
    "request_id_var",
    "requester_id_from",
    "requester_id_var",
    "trace_ids_var",
    "user_exc_info",
    "utc_seconds",
]

#: The request id (taken from the request, else made) and the requester's, as ABEJA's headers
#: carry them; both are in every log record of the request.
REQUEST_ID_HEADER: Final = "x-abeja-request-id"
REQUESTER_ID_HEADER: Final = "x-abeja-requester-id"

request_id_var: ContextVar[str | None] = ContextVar("abeja_request_id", default=None)
#: The trace id and the handler span's id of a traced call (hex, as OpenTelemetry shows them),
#: in the handler's log records while it runs (:mod:`abeja_runtime.tracing`).
trace_ids_var: ContextVar[tuple[str, str] | None] = ContextVar("abeja_trace_ids", default=None)
_ids: Final = random.Random()  # seeded from the system's randomness


#: The longest request id taken from a client; a longer one is replaced
#: (:func:`request_id_from`).
MAX_REQUEST_ID: Final = 128


def request_id_from(given: str | None) -> str:
    """The id of a request: the client's ``x-abeja-request-id`` where it is one the runtime can
    echo in the answer's head and write in every log line (1 to :data:`MAX_REQUEST_ID`
    printable ASCII characters), else a new one (:func:`new_request_id`).

    A byte outside ASCII reaches here as a lone surrogate (aiohttp decodes heads with
    ``surrogateescape``), and an answer head holding it cannot be encoded: such an id once
    left its connection with no answer at all.
    """
    if given is None:  # (most requests)
        return new_request_id()
    return given if _echoable(given) else new_request_id()


def requester_id_from(given: str | None) -> str | None:
    """The client's ``x-abeja-requester-id`` for the logs, by :func:`request_id_from`'s rule
    (``None`` for one that breaks it: nobody else makes one up)."""
    return given if _echoable(given) else None


def _echoable(given: str | None) -> TypeGuard[str]:
    return (
        given is not None
        and 0 < len(given) <= MAX_REQUEST_ID
        and given.isascii()
        and given.isprintable()
    )


def new_request_id() -> str:
    """A request id for a request that came without one: 32 hex digits, as ABEJA's.

    An identifier, not a secret: drawn from a generator seeded once (``os.urandom`` is a
    system call, a measurable part of a small request's cost in the front).
    """
    return _ids.randbytes(16).hex()  # (half the time of formatting getrandbits(128))


requester_id_var: ContextVar[str | None] = ContextVar("abeja_requester_id", default=None)

access_logger: Final = logging.getLogger("abeja_runtime.access")
_handler_output: Final = logging.getLogger("abeja_runtime.worker.handler")
#: Built once: ``json.dumps`` with options builds a new encoder per call, which the access log
#: (one record per request) would pay every time.
encode_record: Final = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str).encode
_LEVEL_NAMES: Final = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "fatal",
}


def format_timestamp(epoch: float, timespec: str = "milliseconds") -> str:
    """``2026-11-21T18:14:14.672+00:00``, ABEJA's format (``microseconds``: 6 digits).

    Called for every log record, so the date part is cached per second.
    """
    seconds = int(epoch)
    fraction = epoch - seconds
    if timespec == "milliseconds":
        digits = f"{min(int(fraction * 1_000), 999):03d}"
    else:
        digits = f"{min(int(fraction * 1_000_000), 999_999):06d}"
    return f"{utc_seconds(seconds)}.{digits}+00:00"


@functools.lru_cache(maxsize=4)
def utc_seconds(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def _add_call_ids(fields: dict[str, Any]) -> None:
    """The ids of the call being served (if any) into a record's fields: the request's, the
    requester's, and the trace's and handler span's when the call is traced."""
    if (request_id := request_id_var.get()) is not None:
        fields.setdefault("request_id", request_id)
    if (requester_id := requester_id_var.get()) is not None:
        fields.setdefault("requester_id", requester_id)
    if (trace_ids := trace_ids_var.get()) is not None:
        fields.setdefault("trace_id", trace_ids[0])
        fields.setdefault("span_id", trace_ids[1])


class JsonFormatter(logging.Formatter):
    """One JSON object per record, keys sorted as ABEJA's logrus output."""

    def __init__(self, static_fields: dict[str, str] | None = None) -> None:
        super().__init__()
        self._static = static_fields or {}

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "preformatted", False):
            return record.getMessage()  # access records, already JSON lines (see AccessLog)
        data = {"message": record.getMessage(), "version": __version__, **self._static}
        data.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            data["traceback"] = self.formatException(record.exc_info)
        data["log_level"] = _LEVEL_NAMES.get(record.levelno, record.levelname.lower())
        data["timestamp"] = format_timestamp(record.created)
        _add_call_ids(data)
        return encode_record(data)


_RUNTIME_DIR: Final = str(Path(__file__).resolve().parent)
#: Where ``os`` is: the standard library's folder (``sysconfig.get_paths()["stdlib"]``, without
#: loading sysconfig's tables into every handler process: 0.2 MiB).
_STDLIB_DIR: Final = os.path.dirname(os.__file__)


def user_exc_info(
    exc: BaseException,
) -> tuple[type[BaseException], BaseException, types.TracebackType | None]:
    """``exc_info`` for an error raised in the user's code, its traceback starting at the
    user's first frame: the runtime's and the standard library's frames above it (the
    executor, the thread hand-off) say nothing to the handler's author. An error with no user
    frame keeps its whole traceback."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith((_RUNTIME_DIR, _STDLIB_DIR)):
        tb = tb.tb_next
    return type(exc), exc, tb if tb is not None else exc.__traceback__


def user_traceback(exc: BaseException) -> str:
    """The traceback of an error raised in the user's code, with the user's frames only.

    Unlike :func:`user_exc_info` this also drops the frames in between: an import error passes
    through the import machinery (``<frozen importlib._bootstrap>``) at every level of the
    user's imports, and none of those frames say anything to the handler's author."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith((_RUNTIME_DIR, _STDLIB_DIR, "<frozen "))
    ]
    shown = traceback.format_list(frames)
    if shown:
        shown.insert(0, "Traceback (most recent call last):\n")
    return "".join([*shown, *traceback.format_exception_only(type(exc), exc)])


class TextFormatter(logging.Formatter):
    """One readable line per record, for a person at a terminal.

    ``2026-11-21 19:14:14.672 ERROR   message  request_id=...``: local time, level, message,
    then the record's fields and the request's ids as ``key=value`` (quoted where a value has
    spaces); a traceback follows on its own lines, as Python prints it, not escaped into one
    string as in JSON. The platform's ids are left out: they are the same on every line.
    """

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, "preformatted", False):
            return record.getMessage()  # an access log made before logging was configured
        fields = dict(getattr(record, "fields", None) or {})
        details = fields.pop("traceback", None)  # a traceback sent by another process, as text
        _add_call_ids(fields)
        level = _LEVEL_NAMES.get(record.levelno, record.levelname.lower()).upper()
        line = f"{_local_time(record.created)} {level:<7} {record.getMessage()}"
        if fields:
            line += "  " + " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif details:
            line += "\n" + str(details).rstrip()
        return line


def _local_time(epoch: float) -> str:
    """``2026-11-21 19:14:14.672``: the terminal's reader's own clock."""
    milliseconds = min(int((epoch - int(epoch)) * 1_000), 999)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(epoch))}.{milliseconds:03d}"


def _text_value(value: object) -> str:
    """A field's value on a text line: as is, or quoted where it would not read as one word."""
    text = str(value)
    if not text or any(char.isspace() or char in '"=' for char in text):
        return encode_record(text)
    return text


def logs_text() -> bool:
    """Whether this process writes its records as text (:func:`configure_logging`'s choice).

    The access log asks: it writes JSON lines of its own, formatted ahead for speed, and takes a
    plainer path for text."""
    return any(
        isinstance(handler.formatter, TextFormatter) for handler in logging.getLogger().handlers
    )


def configure_logging(
    level: str,
    static_fields: dict[str, str] | None = None,
    *,
    log_format: str,
    stream: IO[str] | None = None,
) -> None:
    """Send every log record of this process to stdout (or ``stream``): JSON lines, or text
    lines (``log_format``: ``json``, ``text``, or ``auto``: text when the stream is a terminal).

    Each process resolves ``auto`` itself: handler processes inherit the front's stdout, so they
    come to the same answer."""
    logging.raiseExceptions = False  # a broken stdout must not loop through our own stderr
    target = stream or sys.__stdout__
    handler = logging.StreamHandler(target)
    if log_format == "auto":
        log_format = "text" if target is not None and _is_terminal(target) else "json"
    if log_format == "text":
        handler.setFormatter(TextFormatter())
    else:
        handler.setFormatter(JsonFormatter(static_fields))
    # basicConfig, not logging.config: that module (and what it imports) is 1 MiB in every
    # process, for a dictionary that says the same.
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # aiohttp's own access log is replaced by ours; its errors still show.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed, or not a file at all
        return False


class _LineLogger(io.TextIOBase):
    """A text stream that turns each complete line written to it into a log record.

    Lines are assembled per thread, so concurrent handler calls do not mix their output.
    """

    def __init__(self, level: int, original: TextIO) -> None:
        super().__init__()
        self._level = level
        self._original = original
        self._pending = threading.local()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._original.fileno()

    def write(self, text: str) -> int:
        buffered = getattr(self._pending, "text", "") + text
        *lines, rest = buffered.split("\n")
        self._pending.text = rest
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        rest = getattr(self._pending, "text", "")
        if rest:
            self._pending.text = ""
            self._emit(rest)

    def _emit(self, line: str) -> None:
        line = line.rstrip()
        if line:
            _handler_output.log(self._level, line)


def capture_prints() -> None:
    """Route ``print()`` and other writes to sys.stdout / sys.stderr into log records."""
    # The original streams exist in a worker (stdout is the log pipe); None only without one.
    sys.stdout = _LineLogger(logging.INFO, cast(TextIO, sys.__stdout__))
    sys.stderr = _LineLogger(logging.WARNING, cast(TextIO, sys.__stderr__))
