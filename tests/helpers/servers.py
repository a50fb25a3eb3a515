"""Real runtimes for the tests: started as subprocesses on 127.0.0.1, stopped afterwards.

``ServerFactory`` (the ``make_server`` fixture of ``conftest.py``): ``make_server(handler_dir,
*flags, env=...)`` runs ``python -m abeja_runtime`` through
``abeja_runtime.launch`` (as the CLI's local engine and the benchmarks do) in a copy-free way (the
handler folder is the working directory), binds ports 0 so that no two servers collide, reads the
real ports from the start-up log record, and waits (bounded) until ``/health_check`` says 200.
Every server it started is stopped after the test, with SIGTERM and then SIGKILL of its group.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abeja_runtime.launch import NotHealthy, RuntimeProcess, runtime_command
from helpers.waiting import wait_until

#: The 504 body of a request to a runtime started with ``--timeout 1``.
TIMED_OUT_AFTER_1_S = {
    "status": "handler timed out after 1 s; the limit is ABEJA_RUNTIME_TIMEOUT (--timeout)"
}

#: The handler folders of the tests.
HANDLERS = Path(__file__).resolve().parents[1] / "handlers"
#: The repository's samples; ``KSERVE_CUSTOM``'s ``main.py`` is the custom model example of
#: KServe's docs (its AlexNet replaced by a numpy stand-in), served by the kserve style tests.
SAMPLES = Path(__file__).resolve().parents[2] / "samples"
KSERVE_CUSTOM = SAMPLES / "kserve_custom"
START_TIMEOUT = 60.0  # a loaded 2-core machine imports kserve slowly


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RunningServer:
    """A runtime subprocess, started through ``abeja_runtime.launch``, and what it logged."""

    def __init__(self, runtime: RuntimeProcess, lines: list[str], lock: threading.Lock) -> None:
        self.runtime = runtime
        self.lines = lines
        self._lock = lock

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.runtime.popen

    @property
    def port(self) -> int:
        return self.runtime.port

    @property
    def healthcheck_port(self) -> int:
        return self.runtime.healthcheck_port

    @property
    def reader(self) -> threading.Thread:
        assert self.runtime.reader is not None, "started with on_line: its output is read"
        return self.runtime.reader

    def records(self) -> list[dict[str, Any]]:
        """Every JSON log record so far; non-JSON lines are kept as ``{"raw": line}``."""
        with self._lock:
            lines = list(self.lines)
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except ValueError:
                records.append({"raw": line})
        return records

    def wait_for_record(self, predicate: Callable[[dict[str, Any]], bool], timeout=10.0) -> dict:
        def find() -> dict[str, Any] | None:
            return next((r for r in self.records() if predicate(r)), None)

        return wait_until(find, timeout, "a matching log record")

    def request(
        self,
        method: str = "GET",
        path: str = "/",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        port: int | None = None,
        timeout: float = 30.0,
    ) -> Response:
        connection = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            answer = connection.getresponse()
            return Response(answer.status, answer.headers, answer.read())
        finally:
            connection.close()

    def post_json(self, payload: Any, path: str = "/", **kwargs: Any) -> Response:
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        return self.request("POST", path, json.dumps(payload).encode(), headers, **kwargs)

    def health(self, port: int | None = None) -> int:
        try:
            return self.request("GET", "/health_check", port=port or self.healthcheck_port).status
        except OSError:
            return 0

    def in_flight(self) -> float:
        """The requests being answered now, as ``/metrics`` counts them."""
        return self._gauge("abeja_runtime_in_flight_requests")

    def queued(self) -> float:
        """The calls waiting for a handler slot now, as ``/metrics`` counts them."""
        return self._gauge("abeja_runtime_queued_requests")

    def _gauge(self, name: str) -> float:
        metrics = self.request("GET", "/metrics", port=self.healthcheck_port).body.decode()
        for line in metrics.splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        raise AssertionError(f"no {name} in /metrics")

    def wait_healthy(self, timeout: float = START_TIMEOUT) -> None:
        try:
            self.runtime.wait_healthy(timeout)
        except NotHealthy as exc:
            raise AssertionError(f"{exc}: {self.lines}") from None

    def wait_exit(self, timeout: float = 20.0) -> int:
        """Wait for a runtime that stops by itself, and for its last log line to be read."""
        code = self.process.wait(timeout)
        self.reader.join(timeout)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 40.0) -> int:
        """Signal the runtime, wait for it (bounded) and for its log reader; returns the code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"the runtime did not stop within {timeout} s of {sig}") from None
        finally:
            self.reader.join(10)  # EOF once the supervisor and its workers are gone


def runtime_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ABEJA_", "PORT", "HANDLER"))}
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    # No balancer in front of a test's server: its stop need not wait for one to notice
    # (the drain tests give their own delay).
    env["ABEJA_RUNTIME_DRAIN_DELAY"] = "0"
    env.update(extra)
    return env


class ServerFactory:
    """Starts runtimes for tests and stops every one of them at teardown."""

    def __init__(self, tmp_dir: Path) -> None:
        self._tmp_dir = tmp_dir
        self._started: list[RunningServer] = []

    def __call__(
        self,
        handler_dir: str | Path,
        *flags: str,
        env: dict[str, str] | None = None,
        wait: bool = True,
        cwd: Path | None = None,
        ports: tuple[int, int] | None = None,
        subcommand: tuple[str, ...] = (),
    ) -> RunningServer:
        """``ports``: the ports ``flags`` or ``env`` set, for a runtime that logs no start-up
        record; by default ports 0 are passed and the record says which were bound.
        ``subcommand`` (``("kserve", "model.py")``) comes first and takes ``flags`` only: its
        ports come from ``ports``, set by ``flags`` or ``env``."""
        directory = HANDLERS / handler_dir if isinstance(handler_dir, str) else handler_dir
        args = [*subcommand] if subcommand else ["--host", "127.0.0.1"]
        if ports is None:
            args += ["--port", "0", "--healthcheck-port", "0"]
        lines: list[str] = []
        lock = threading.Lock()

        def keep(line: str) -> None:
            with lock:
                lines.append(line)

        runtime = RuntimeProcess(
            runtime_command(*args, *flags),
            cwd=cwd or directory,
            env=runtime_env(**{"TMPDIR": str(self._tmp_dir), **(env or {})}),
            on_line=keep,
        )
        if ports is not None:
            runtime.port, runtime.healthcheck_port = ports
        server = RunningServer(runtime, lines, lock)
        self._started.append(server)
        if wait:
            server.wait_healthy()
        else:
            runtime.wait_for_ports(START_TIMEOUT)
        return server

    def stop_all(self) -> None:
        for server in self._started:
            with contextlib.suppress(AssertionError):  # killed after 15 s; reported by tests
                server.stop(timeout=15)
            server.runtime.kill()  # and whatever of its process group is left


def call_all(server: RunningServer, paths: list[str], timeout: float = 15.0) -> list[Response]:
    """GET every path at once, each on its own connection; answers in the order of ``paths``."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(paths)) as pool:
        return list(pool.map(lambda path: server.request("GET", path, timeout=timeout), paths))


def front_memory_mib(server: RunningServer, field: str = "VmRSS") -> float:
    """The front's ``VmRSS`` (or ``VmHWM``, its peak) in MiB, read from ``/proc``."""
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{server.process.pid}/status")
