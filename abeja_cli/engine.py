"""What both engines share: the run description, the running-server interface, log display,
and the bounded wait until the model answers its health check.

An engine (``docker_engine.DockerEngine`` or ``local_engine.LocalEngine``) has three verbs:
``prepare(spec)`` (build or check what is needed; may take long), ``serve(spec, sink)``, a
context manager yielding a :class:`Server` that is stopped and removed on every way out, and
``run_batch(spec, batch, sink, answer)``, which runs ``abeja-runtime batch`` to its end and
returns its exit code.
"""

from __future__ import annotations

import collections
import json
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, Protocol

from abeja_cli.errors import ServerError
from abeja_runtime.launch import NotHealthy, wait_healthy

if TYPE_CHECKING:
    from abeja_cli.console import Console

__all__ = [
    "BatchSpec",
    "Engine",
    "LogSink",
    "RunSpec",
    "Server",
    "format_log_line",
    "wait_ready",
]

#: Port of the runtime inside a container (the platform's; ``PORT`` default of the runtime).
SERVICE_PORT: Final = 5000
#: How many log lines are kept for error reports; older ones are dropped.
_LOG_KEEP: Final = 5000


@dataclass(frozen=True)
class RunSpec:
    """Everything an engine needs to run one project."""

    project: Path
    handler: str
    env: Mapping[str, str]
    image: str = "python:3.11-slim"
    device_type: str = "x86_cpu"
    host_port: int | None = None
    no_cache: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Local engine: pass the user's whole shell environment, not only a minimal part of it.
    inherit_env: bool = False


@dataclass(frozen=True)
class BatchSpec:
    """An ``abeja-runtime batch`` run: input files and folders, and the folder for their
    answers, on this machine; no inputs means the one input of ``INPUT`` (``-e INPUT=...``)."""

    inputs: tuple[Path, ...] = ()
    output: Path | None = None

    def arguments(self, inputs: list[str], output: str | None) -> list[str]:
        """The runtime's arguments, with the paths as the process running it sees them."""
        return ["batch", *inputs, *(["--output", output] if output is not None else [])]


class Server(ABC):
    """A running model server, reachable at :attr:`url` on the loopback interface."""

    url: str
    #: One line saying what runs (shown in the run-local-server banner).
    description: str
    #: The thread passing the server's output to the log sink, once started.
    log_thread: threading.Thread | None = None

    @abstractmethod
    def exit_code(self) -> int | None:
        """None while the server runs, else the exit status of its process."""

    def drain_logs(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until the log reader has passed on everything the server wrote."""
        if self.log_thread is not None:
            self.log_thread.join(timeout)

    @abstractmethod
    def restart(self) -> None:
        """Stop the runtime and start it again (``--reload``); the URL stays the same."""

    @abstractmethod
    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then kill after a grace period)."""


class Engine(Protocol):
    """The interface both engines implement."""

    name: str

    def prepare(self, spec: RunSpec) -> None: ...

    def serve(self, spec: RunSpec, sink: LogSink) -> AbstractContextManager[Server]: ...

    def run_batch(self, spec: RunSpec, batch: BatchSpec, sink: LogSink, answer: BinaryIO) -> int:
        """Run the batch to its end: its log (stderr) to ``sink``, its stdout (the answer to
        ``INPUT``) to ``answer``; returns its exit code. Nothing is left running."""
        ...


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


def wait_ready(server: Server, *, timeout: float, sink: LogSink | None = None) -> None:
    """Poll the health check until it says 200; fail early when the server process exits.

    Raises :class:`ServerError` (with the server log) when the server exits or is not ready
    within ``timeout`` seconds. abeja-sdk's CLI polled once a second; 0.05 s keeps start-up snappy.
    """
    host, _, port = server.url.removeprefix("http://").partition(":")
    try:
        wait_healthy(host, int(port), timeout=timeout, exit_code=server.exit_code)
    except NotHealthy as exc:
        if exc.exit_code is not None:
            server.drain_logs()
            message = (
                f"the model server stopped before it was ready (exit code {exc.exit_code}); "
                "its log says why (often the handler failed to import)"
            )
        else:
            seen = (
                f"it answered {exc.last_status}"
                if exc.last_status is not None
                else ("it did not answer")
            )
            message = (
                f"the model server was not ready after {timeout:g} s ({seen} on "
                f"{server.url}/health_check); raise --startup-timeout if loading the model "
                "takes longer"
            )
        raise ServerError(message, log=sink.text() if sink else "") from None
