"""Starting the runtime as a subprocess, and waiting until it is healthy.

The one way to do it, used by ``abeja model run-local --engine local``, the tests' server
factory and the benchmarks: a process in a session of its own (so that its workers can be
stopped with it), its output read line by line on a thread, the ports it really bound (port 0
lets the system pick; the start-up log record says which), a bounded wait for
``/health_check``, and a stop that escalates from SIGTERM to SIGKILL of the whole group.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

__all__ = [
    "NotHealthy",
    "RuntimeProcess",
    "free_port",
    "free_ports",
    "health_status",
    "runtime_command",
    "wait_healthy",
]

#: Between two health probes while waiting: short, so that a start takes no longer than it must.
_POLL_INTERVAL: Final = 0.05


class NotHealthy(Exception):
    """The server exited (``exit_code`` set) or did not say 200 in time (``last_status``)."""

    def __init__(self, message: str, *, exit_code: int | None, last_status: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.last_status = last_status


#: Tries to find a free port other than some given ones (the system rarely repeats one).
_PORT_TRIES: Final = 100
#: Ports are picked from here up to the ephemeral range (below: well-known services' ports).
_LOWEST_PICKED: Final = 20000
_EPHEMERAL_LOW: Final = 32768


def free_port(host: str = "127.0.0.1", *, other_than: Collection[int] = ()) -> int:
    """A port on ``host`` that was free a moment ago, and none of ``other_than`` (ports picked
    a moment before).

    It comes from below the system's ephemeral range where it can: a port from that range (what
    binding port 0 gives) is also what the next outgoing connection may take as its local port,
    so a port picked now and bound seconds later (a container published on it) was sometimes
    taken meanwhile ("address already in use")."""
    low = _ephemeral_low()
    for _ in range(_PORT_TRIES):
        port = random.randrange(_LOWEST_PICKED, low) if low > _LOWEST_PICKED else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            port = int(sock.getsockname()[1])
        if port not in other_than:
            return port
    raise OSError(f"no free port on {host} other than {sorted(other_than)}")


def _ephemeral_low() -> int:
    """The first port of the system's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different ports of :func:`free_port`."""
    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(host, other_than=ports))
    return ports


def runtime_command(*args: str, python: str = sys.executable) -> list[str]:
    """``python -m abeja_runtime ARGS``."""
    return [python, "-m", "abeja_runtime", *args]


def health_status(host: str, port: int, *, timeout: float = 2.0) -> int | None:
    """The status of ``GET /health_check``, or None when nothing answers."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/health_check")
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()


def wait_healthy(
    host: str, port: int, *, timeout: float, exit_code: Callable[[], int | None]
) -> float:
    """Poll ``/health_check`` until it says 200; the seconds it took.

    Raises :class:`NotHealthy` as soon as ``exit_code()`` says the server stopped, or after
    ``timeout`` seconds.
    """
    started = time.monotonic()
    last: int | None = None
    while True:
        code = exit_code()
        if code is not None:
            raise NotHealthy(
                f"the server stopped before it was ready (exit code {code})",
                exit_code=code,
                last_status=last,
            )
        last = health_status(host, port)
        if last == 200:
            return time.monotonic() - started
        if time.monotonic() - started >= timeout:
            seen = f"it answered {last}" if last is not None else "it did not answer"
            raise NotHealthy(
                f"the server was not ready after {timeout:g} s ({seen} on "
                f"http://{host}:{port}/health_check)",
                exit_code=None,
                last_status=last,
            )
        time.sleep(_POLL_INTERVAL)


class RuntimeProcess:
    """A server started in a session of its own, with its output read on a thread.

    ``on_line`` gets each line of its output (stdout and stderr together), decoded as UTF-8.
    With ``output`` instead, the output goes straight into that file and no thread reads it
    (the caller then sets the ports): a benchmark's server pays for its log's writes, not for
    a reader that relays every line.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path,
        env: Mapping[str, str],
        on_line: Callable[[str], None] | None = None,
        output: IO[bytes] | None = None,
        host: str = "127.0.0.1",
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.host = host
        self.port = 0
        self.healthcheck_port = 0
        self._on_line = on_line
        self._ports_seen = threading.Event()
        self.popen = subprocess.Popen(
            list(command),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if output is None else output,
            stderr=subprocess.STDOUT,
            # A Ctrl+C in a terminal reaches only the parent, which then stops the server in
            # order; and the server's workers share its group, so they are stopped with it.
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        self.reader: threading.Thread | None = None
        if output is None:
            stream: IO[bytes] = self.popen.stdout  # type: ignore[assignment]
            self.reader = threading.Thread(
                target=self._read, args=(stream,), name="runtime-output", daemon=True
            )
            self.reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        return self.popen.poll()

    def _read(self, stream: IO[bytes]) -> None:
        # Only this thread touches the pipe: closing it from another thread would block until
        # a pending read returns. The pipe ends when every process of the server has exited.
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if not self._ports_seen.is_set():
                    self._look_for_ports(line)
                if self._on_line is not None:
                    self._on_line(line)
        self._ports_seen.set()  # no more lines: whoever waits for the ports stops waiting

    def _look_for_ports(self, line: str) -> None:
        """The start-up record (``{"port": ..., "healthcheck_port": ...}``) names the ports."""
        if '"healthcheck_port"' not in line:
            return
        with contextlib.suppress(ValueError, KeyError, TypeError):
            record = json.loads(line)
            self.port, self.healthcheck_port = record["port"], record["healthcheck_port"]
            self._ports_seen.set()

    def wait_for_ports(self, timeout: float) -> bool:
        """Wait (bounded) for the start-up record; False if the server exited without one."""
        self._ports_seen.wait(timeout)
        return bool(self.port)

    def wait_healthy(self, timeout: float) -> float:
        """The seconds until ``/health_check`` said 200; :class:`NotHealthy` if it did not."""
        started = time.monotonic()
        if not self.healthcheck_port and not self.wait_for_ports(timeout):
            code = self.exit_code()
            raise NotHealthy(
                "the server logged no start-up record with its ports"
                + (f" (it exited with code {code})" if code is not None else ""),
                exit_code=code,
                last_status=None,
            )
        left = max(0.0, timeout - (time.monotonic() - started))
        wait_healthy(self.host, self.healthcheck_port, timeout=left, exit_code=self.exit_code)
        return time.monotonic() - started

    def stop(self, grace: float) -> int:
        """SIGTERM, up to ``grace`` seconds to finish, then SIGKILL to the whole group."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        return self.kill()

    def kill(self) -> int:
        """Kill whatever of the group still runs, and reap the server."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        return self.popen.wait()
