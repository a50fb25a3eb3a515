"""The main process: bind the ports once, keep ``workers`` processes alive, shut down in order.

Workers share the listening sockets created here, so connections wait in one kernel queue: a
worker that dies loses only the requests it was running, never the queued ones. The supervisor
replaces a worker that dies, recycles one whose handler is stuck (contract A1), and stops with
exit 1 instead of crash-looping when the handler cannot be loaded. Signal handlers only record
the signal; the loop acts on it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, Final

from abeja_runtime import __version__
from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.loader import install_dependencies, prepare_workdir
from abeja_runtime.logs import configure_logging

__all__ = ["run"]

_log = logging.getLogger("abeja_runtime")
_mp = multiprocessing.get_context("spawn")  # a clean interpreter per worker; no forked state
#: Extra seconds past the grace period before stragglers are killed at shutdown.
_KILL_MARGIN: Final = 5.0
_BACKLOG: Final = 2048
#: Until a worker accepts (its interpreter needs ~0.5 s to import aiohttp), the supervisor answers
#: health checks itself, so that a probe sees 503 within a fraction of a second of the start.
_STARTING_BODY: Final = json.dumps({"status": "service unavailable"}).encode()
_STARTING_RESPONSE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_STARTING_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _STARTING_BODY
)
#: A probe gets this long to send its request line before the supervisor moves on.
_STARTING_READ_TIMEOUT: Final = 0.5


def run(config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    configure_logging(config.log_level, config.platform.log_fields())
    workdir = prepare_workdir(config.user_model_root, config.training_result_dir)
    try:
        if config.install_requirements:
            install_dependencies(workdir)
        sockets = (_listen(config.host, config.port), _listen(config.host, config.healthcheck_port))
    except (HandlerLoadError, OSError) as exc:
        _log.error("failed to setup model: %s", exc)
        return 1
    port, healthcheck_port = (sock.getsockname()[1] for sock in sockets)
    _log.info(
        "abeja-runtime %s serving %s from %s on http://%s:%d (health check port %d); "
        "workers=%d concurrency=%d timeout=%gs",
        __version__,
        config.handler,
        workdir,
        config.host,
        port,
        healthcheck_port,
        config.workers,
        config.concurrency,
        config.timeout,
        extra={"fields": {"port": port, "healthcheck_port": healthcheck_port}},
    )
    try:
        return _Supervisor(config, sockets).run()
    finally:
        for sock in sockets:
            sock.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
    sock.set_inheritable(True)
    return sock


class _WorkerProcess:
    """A worker process and the pipe it reports on."""

    def __init__(self, config: Config, sockets: tuple[socket.socket, ...], accept_early: bool):
        from abeja_runtime.worker import run_worker  # only workers import aiohttp

        self.pipe, child_end = _mp.Pipe(duplex=False)
        self.process: BaseProcess = _mp.Process(
            target=run_worker,
            args=(config, *sockets, child_end, accept_early),
            name="abeja-runtime-worker",
        )
        self.process.start()
        child_end.close()
        self.state = "starting"  # → ready → (stuck) → stopping

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send_signal(self, signum: int) -> None:
        if self.process.is_alive() and self.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)


class _Supervisor:
    def __init__(self, config: Config, sockets: tuple[socket.socket, socket.socket]) -> None:
        self._config = config
        self._sockets = sockets
        self._workers: list[_WorkerProcess] = []
        self._signals: list[int] = []
        self._shutdown_deadline: float | None = None
        self._exit_code = 0
        self._a_worker_accepts = False

    def run(self) -> int:
        wake_reader, wake_writer = socket.socketpair()
        wake_writer.setblocking(False)
        previous = {
            signum: signal.signal(signum, self._record_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        previous_fd = signal.set_wakeup_fd(wake_writer.fileno())
        try:
            for _ in range(self._config.workers):
                self._spawn(accept_early=True)
            while self._workers:
                self._step(wake_reader)
            return self._exit_code
        finally:
            signal.set_wakeup_fd(previous_fd)
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            for worker in self._workers:
                worker.process.kill()
            wake_reader.close()
            wake_writer.close()

    def _record_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    def _spawn(self, accept_early: bool) -> None:
        worker = _WorkerProcess(self._config, self._sockets, accept_early)
        self._workers.append(worker)
        _log.debug("started worker %s", worker.pid)

    def _step(self, wake_reader: socket.socket) -> None:
        waitables: list[Any] = [wake_reader]
        health_socket = self._sockets[1]
        if not self._a_worker_accepts:
            waitables.append(health_socket)
        for worker in self._workers:
            waitables += [worker.process.sentinel]
            if not worker.pipe.closed:
                waitables.append(worker.pipe)
        timeout = None
        if self._shutdown_deadline is not None:
            timeout = max(0.0, self._shutdown_deadline - time.monotonic())
        ready = wait(waitables, timeout)
        if wake_reader in ready:
            with contextlib.suppress(BlockingIOError):
                wake_reader.recv(4096)
        self._handle_signals()
        if health_socket in ready and not self._a_worker_accepts:
            _answer_while_starting(health_socket)
        for worker in list(self._workers):
            if worker.pipe in ready:
                self._handle_message(worker)
            if worker.process.sentinel in ready:
                self._handle_exit(worker)
        if self._shutdown_deadline is not None and time.monotonic() >= self._shutdown_deadline:
            for worker in self._workers:
                _log.warning("worker %s did not stop in time; killing it", worker.pid)
                worker.process.kill()
                worker.process.join(5)
            self._workers.clear()

    def _handle_signals(self) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            if self._shutdown_deadline is None:
                _log.info(
                    "signal %s received; shutting down gracefully", signal.Signals(signum).name
                )
                self._begin_shutdown()
            else:
                _log.warning("second signal received; stopping at once")
                for worker in self._workers:
                    worker.process.kill()
                self._exit_code = 1

    def _begin_shutdown(self) -> None:
        # New connections to the service port are refused from now on; the health port stays
        # open so that draining workers can answer 503.
        self._sockets[0].close()
        self._shutdown_deadline = time.monotonic() + self._config.grace_period + _KILL_MARGIN
        for worker in self._workers:
            worker.state = "stopping"
            worker.send_signal(signal.SIGTERM)

    def _handle_message(self, worker: _WorkerProcess) -> None:
        try:
            message = worker.pipe.recv()
        except (EOFError, OSError):
            worker.pipe.close()
            return
        kind = message[0]
        if kind == "accepting":
            self._a_worker_accepts = True
        elif kind == "ready":
            self._a_worker_accepts = True
            if worker.state == "starting":
                worker.state = "ready"
                _log.info("worker %s is ready", worker.pid)
            self._retire_stuck_workers()
        elif kind == "load_failed":
            _, text, details = message
            fields = {"traceback": details.rstrip()} if details else {}
            _log.error("failed to setup model: %s", text, extra={"fields": fields})
            self._exit_code = 1
            if self._shutdown_deadline is None:
                self._begin_shutdown()
        elif kind == "stuck":
            worker.state = "stuck"
            self._spawn(accept_early=not self._ready_workers())
            self._retire_stuck_workers()

    def _ready_workers(self) -> list[_WorkerProcess]:
        return [worker for worker in self._workers if worker.state == "ready"]

    def _retire_stuck_workers(self) -> None:
        """Stop stuck workers once a healthy one can take their traffic."""
        if not self._ready_workers():
            return
        for worker in self._workers:
            if worker.state == "stuck":
                worker.state = "stopping"
                _log.warning("recycling worker %s, whose handler is stuck", worker.pid)
                worker.send_signal(signal.SIGTERM)

    def _handle_exit(self, worker: _WorkerProcess) -> None:
        worker.process.join()
        self._workers.remove(worker)
        if not worker.pipe.closed:
            while worker.pipe.poll():  # a last message (e.g. load_failed) may still be queued
                self._handle_message(worker)
                if worker.pipe.closed:
                    break
            worker.pipe.close()
        code = worker.process.exitcode
        if worker.state == "stopping" or self._shutdown_deadline is not None:
            return
        if worker.state == "starting":
            _log.error("a worker exited with code %s before it was ready; stopping", code)
            self._exit_code = 1
            self._begin_shutdown()
            return
        _log.error(
            "worker %s exited unexpectedly (%s); starting a replacement",
            worker.pid,
            _describe_exit(code),
        )
        self._spawn(accept_early=not self._ready_workers())


def _answer_while_starting(health_socket: socket.socket) -> None:
    """Answer one health probe with 503 before any worker listens; bounded, never blocks long."""
    health_socket.setblocking(False)  # a worker may have taken the connection first
    try:
        connection, _ = health_socket.accept()
    except (BlockingIOError, InterruptedError):
        return
    with connection:
        connection.settimeout(_STARTING_READ_TIMEOUT)
        try:
            connection.recv(8192)
            connection.sendall(_STARTING_RESPONSE)
        except OSError:
            pass


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
