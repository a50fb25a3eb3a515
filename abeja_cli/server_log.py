"""The model server's log on the terminal: each JSON line shortened, the lines kept for the
error report when something fails.
"""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from abeja_cli.console import Console

__all__ = ["LogSink", "format_log_line", "pump_lines", "start_daemon"]

#: How many log lines are kept for error reports; older ones are dropped.
_LOG_KEEP: Final = 5000


def format_log_line(line: str) -> str:
    """Shorten one runtime log line for the terminal.

    The runtime writes one JSON object per line. A record with ``message`` is shown as that
    message (with its level when it is not info), an access-log record as one short line, and
    anything else (a plain ``print`` that escaped, a traceback line) as is.
    """
    stripped = line.strip()
    if not stripped.startswith("{"):
        return line
    try:
        record = json.loads(stripped)
    except ValueError:
        return line
    if not isinstance(record, dict):
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

    Engines feed it from a reader thread; the CLI reads :meth:`text` when something failed.
    """

    def __init__(self, console: Console, *, show: bool = True) -> None:
        self._console = console
        self.show = show
        self._lines: collections.deque[str] = collections.deque(maxlen=_LOG_KEEP)
        self._lock = threading.Lock()

    def __call__(self, line: str) -> None:
        line = line.rstrip("\r\n")
        with self._lock:
            self._lines.append(line)
        if self.show:
            self._console.log(format_log_line(line))

    def text(self) -> str:
        """The kept lines, formatted the same way as when they were shown."""
        with self._lock:
            lines = list(self._lines)
        return "\n".join(format_log_line(line) for line in lines)


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
