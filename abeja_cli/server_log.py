"""The model server's log on the terminal: each JSON line shortened, the lines kept for the
error report when something fails, for the try-it page (one request's lines) and for
``--reload`` (the error that stopped the server).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from abeja_cli.console import Console

__all__ = ["LogSink", "format_log_line", "pump_lines", "start_daemon"]

#: How many log lines are kept for error reports; older ones are dropped.
_LOG_KEEP: Final = 5000


def _record(line: str) -> dict[str, Any] | None:
    """The JSON object of a runtime log line, or None for anything else."""
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        record = json.loads(stripped)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def format_log_line(line: str) -> str:
    """Shorten one runtime log line for the terminal.

    The runtime writes one JSON object per line. A record with ``message`` is shown as that
    message (with its level when it is not info), an access-log record as one short line, and
    anything else (a plain ``print`` that escaped, a traceback line) as is.
    """
    record = _record(line)
    if record is None:
        return line
    if record.get("log_type") == "access_log":
        elapsed = record.get("elapsed_microsecs")
        took = f" ({elapsed / 1000:.1f} ms)" if isinstance(elapsed, int | float) else ""
        method, status = record.get("http_method", "?"), record.get("http_status", "?")
        path = record.get("http_path")
        return f"access: {method} {path + ' ' if path else ''}{status}{took}"
    message = record.get("message")
    if not isinstance(message, str):
        return line
    level = str(record.get("log_level", "info")).lower()
    text = message if level in ("info", "debug") else f"{level.upper()}: {message}"
    for key in ("exc_info", "traceback", "exception"):
        extra = record.get(key)
        if isinstance(extra, str) and extra:
            text += "\n" + extra.rstrip("\n")
    return text


class LogSink:
    """Receives the server's log lines: shows them (formatted) and keeps them for error reports.

    Engines feed it from a reader thread; the CLI reads :meth:`text` when something failed, the
    try-it page :meth:`request_lines`, ``--reload`` :meth:`record_since` a :meth:`mark`.
    """

    def __init__(self, console: Console, *, show: bool = True) -> None:
        self._console = console
        self.show = show
        self._lines: collections.deque[str] = collections.deque(maxlen=_LOG_KEEP)
        self._received = 0  # lines ever received: a mark stays valid as old lines are dropped
        self._added = threading.Condition()

    def __call__(self, line: str) -> None:
        line = line.rstrip("\r\n")
        with self._added:
            self._lines.append(line)
            self._received += 1
            self._added.notify_all()
        if self.show:
            self._console.log(format_log_line(line))

    def _kept(self) -> list[str]:
        with self._added:
            return list(self._lines)

    def text(self) -> str:
        """The kept lines, formatted the same way as when they were shown."""
        return "\n".join(format_log_line(line) for line in self._kept())

    def mark(self) -> int:
        """A position in the log, for :meth:`since`."""
        with self._added:
            return self._received

    def record_since(
        self, mark: int, wanted: Callable[[dict[str, Any]], bool], *, timeout: float
    ) -> dict[str, Any] | None:
        """The first JSON record received after ``mark`` that is ``wanted``, waiting for it at
        most ``timeout`` seconds (``None``: none came)."""
        deadline = time.monotonic() + timeout
        with self._added:
            while True:
                for line in self._after(mark):
                    record = _record(line)
                    if record is not None and wanted(record):
                        return record
                mark = self._received
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._added.wait(remaining)

    def _after(self, mark: int) -> list[str]:
        """The lines received after ``mark`` that are still kept (with the lock held)."""
        count = min(self._received - mark, len(self._lines))
        return list(self._lines)[len(self._lines) - count :] if count > 0 else []

    def request_lines(self, request_id: str, *, timeout: float) -> tuple[list[str], bool]:
        """The lines logged for one request (its access record left out), formatted, and
        whether they are all there: the runtime's front writes the access record once the
        answer has gone, after every line of the handler's, so its arrival ends the wait; at
        most ``timeout`` seconds (an access log turned off never sends one)."""
        quoted = json.dumps(request_id)  # how the id appears in a JSON line
        deadline = time.monotonic() + timeout
        with self._added:
            while True:
                lines, complete = _lines_of(self._lines, request_id, quoted)
                remaining = deadline - time.monotonic()
                if complete or remaining <= 0:
                    return lines, complete
                self._added.wait(remaining)


def _lines_of(lines: Iterable[str], request_id: str, quoted: str) -> tuple[list[str], bool]:
    mine, complete = [], False
    for line in lines:
        if quoted not in line:
            continue
        record = _record(line)
        if record is None or record.get("request_id") != request_id:
            continue
        if record.get("log_type") == "access_log":
            complete = True
        else:
            mine.append(format_log_line(line))
    return mine, complete


def pump_lines(chunks: Iterator[bytes], sink: Callable[[str], None]) -> None:
    """Split a byte stream into lines (decoded as UTF-8) and feed them to ``sink``."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            sink(line.decode("utf-8", "replace"))
    if pending:
        sink(pending.decode("utf-8", "replace"))


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread: a stuck log stream must never keep the CLI alive after it is done."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
