"""The main process: bind the ports, keep ``workers`` processes alive, answer for the service.

Workers share the service socket bound here; the health-check port is served here, never by a
worker, so readiness, liveness and ``/metrics`` answer whatever one worker does. The supervisor
is an asyncio loop that reacts to four things:

* worker messages on a pipe: ``ready``, ``load_failed``, and a ``heartbeat`` twice a second
  with the age of the worker's oldest handler call and its open connections; a worker holding
  well over its share of the connections (the survivor of a crash, once the replacement is
  ready) is told to close that many after their next response, so that a crash costs the
  clients of one worker's share, not of all the connections;
* worker exits: a worker that dies at any time after the service was first ready is replaced,
  with a growing back-off while replacements keep dying before they are ready; one that cannot
  load the handler at the very first start stops the service (exit 1), as on the anchor;
* a tick: a heartbeat silent for ``timeout + grace`` means the worker's event loop is blocked,
  and it is killed and replaced; a handler call older than that means a stuck thread, and the
  worker is drained and replaced; a heartbeat silent for a few seconds already takes the worker
  out of readiness;
* SIGTERM/SIGINT: the service port stops accepting, readiness says 503 once every worker has
  stopped taking new connections (at most 5 s later), workers drain within the grace
  period; a second signal kills them.

While no worker is ready the supervisor itself answers the service port with 503, so a request
never waits behind a loading worker and, once readiness says 200, no request gets 503 because
some worker is still loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Final

from abeja_runtime import __version__
from abeja_runtime.config import Config, MiB
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.loader import install_dependencies, prepare_workdir
from abeja_runtime.logs import configure_logging
from abeja_runtime.metrics import SupervisorMetrics, use_directory

if TYPE_CHECKING:  # imported in run(), while the first workers start
    from abeja_runtime.server import ServiceFallback

__all__ = ["run"]

_log = logging.getLogger("abeja_runtime")
#: Extra seconds past the grace period before stragglers are killed at shutdown.
_KILL_MARGIN: Final = 5.0
_BACKLOG: Final = 2048
#: Heartbeats are sent every 0.5 s; a loop silent for this long is not counted as ready. Long
#: enough for an ``async def`` handler that computes for a second without awaiting.
_UNRESPONSIVE_AFTER: Final = 3.0
_TICK: Final = 0.25
#: A worker is told to shed connections only when it holds more than its fair share plus this
#: many (or a fifth of the share, if more): small imbalances are not worth reconnecting for.
_SHED_SLACK: Final = 1
#: After a worker was told to shed, its counts are left alone this long while clients reconnect.
_SHED_SETTLE: Final = 1.0
#: At shutdown, readiness says 503 once every worker has stopped taking new connections (each
#: tells us on its pipe), or after this long (a worker whose loop is blocked cannot say so): a
#: client that saw 503 never gets a new connection served by a worker unaware of the shutdown.
_STOP_ACCEPTING_WAIT: Final = 5.0
#: Back-off before the next replacement while replacements keep dying before they are ready:
#: the first is immediate, then 0.5 s doubling up to this.
_MAX_BACKOFF: Final = 30.0
#: After the system refused to start a worker process, when the supervisor tries again.
_SPAWN_RETRY: Final = 1.0
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def run(config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    configure_logging(config.log_level, config.platform.log_fields())
    try:
        tempfile.gettempdir()  # metrics files and request bodies above the spool threshold
    except FileNotFoundError:
        _log.error(
            "cannot start: no writable temporary directory (TMPDIR, /tmp, /var/tmp); in a "
            "read-only container mount one on /tmp (docker run --read-only --tmpfs /tmp, or an "
            "emptyDir volume on /tmp in Kubernetes), or set TMPDIR to a writable folder"
        )
        return 1
    workdir = prepare_workdir(config.user_model_root, config.training_result_dir)
    try:
        if config.install_requirements:
            install_dependencies(workdir)
        sockets = (_listen(config.host, config.port), _listen(config.host, config.healthcheck_port))
        if config.grpc_port is not None:
            _check_free(config.host, config.grpc_port)
    except (HandlerLoadError, OSError) as exc:
        _log.error("failed to setup model: %s", exc)
        return 1
    port, healthcheck_port = (sock.getsockname()[1] for sock in sockets)
    _log.info(
        "abeja-runtime %s serving %s from %s on http://%s:%d (health check port %d); "
        "workers=%d concurrency=%d timeout=%gs loop=%s",
        __version__,
        config.handler,
        workdir,
        config.host,
        port,
        healthcheck_port,
        config.workers,
        config.concurrency,
        config.timeout,
        config.event_loop,
        extra={"fields": {"port": port, "healthcheck_port": healthcheck_port}},
    )
    try:
        with tempfile.TemporaryDirectory(prefix="abeja-runtime-metrics-") as metrics_dir:
            use_directory(metrics_dir)  # before prometheus_client is imported, here or in workers
            return asyncio.run(_Supervisor(config, sockets).run())
    finally:
        for sock in sockets:
            sock.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=_BACKLOG)
    sock.set_inheritable(True)
    return sock


def _check_free(host: str, port: int) -> None:
    """The gRPC port is bound by each worker (gRPC takes no socket from its parent): say now,
    not after the handler has loaded, that another program holds it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise OSError(
            f"cannot listen for gRPC on {host}:{port} ({exc.strerror}); another program may "
            "use the port: choose another with --grpc-port"
        ) from None


class _WorkerProcess:
    """A worker process, the pipe it reports on, and what the supervisor knows of it.

    A fresh interpreter (``python -m abeja_runtime.worker``), not a fork: no state of the
    supervisor's is copied. Not ``multiprocessing`` either, whose spawn starts a resource
    tracker process that nothing here needs. The worker inherits the service socket and its
    end of a socket pair, on which the first message is its ``Config``.
    """

    def __init__(self, config: Config, service_socket: socket.socket) -> None:
        ours, theirs = socket.socketpair()
        fds = (service_socket.fileno(), theirs.fileno())
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "abeja_runtime.worker", *map(str, fds)], pass_fds=fds
            )
        self.pipe = Connection(ours.detach())
        # A worker killed before it read this (a kill right as it starts) is seen as dead by the
        # exit watch and replaced like any other; raising here lost it, and its replacement.
        with contextlib.suppress(OSError):
            self.pipe.send(config)
        self.pid: int = self.process.pid
        #: Readable once the process has exited (Linux); elsewhere the tick polls for it.
        self.exit_fd: int | None = _pidfd(self.pid)
        self.state = "starting"  # → ready → stopping (drained, killed, or shut down)
        self.last_beat = time.monotonic()
        self.reported_silent = False
        self.connections = 0  # as of the last heartbeat
        self.shed_settles_at = 0.0
        #: Being replaced (its replacement starts; it drains once that one is ready).
        self.retiring = False
        #: The worker this one replaces, until it is ready.
        self.replaces: _WorkerProcess | None = None

    def serving(self, now: float) -> bool:
        return self.state == "ready" and now - self.last_beat < _UNRESPONSIVE_AFTER

    def tell(self, message: tuple[object, ...]) -> None:
        """A message to the worker; one whose pipe is gone is being replaced anyway."""
        with contextlib.suppress(OSError):
            self.pipe.send(message)

    def send_signal(self, signum: int) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits, where the system has them."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:  # an older kernel
        return None
    return fd


class _Supervisor:
    def __init__(self, config: Config, sockets: tuple[socket.socket, socket.socket]) -> None:
        self._config = config
        self._service_socket, self._health_socket = sockets
        self._workers: list[_WorkerProcess] = []
        self._ever_ready = False
        self._draining = False
        #: At shutdown: the workers that may still accept, and when readiness says 503 anyway.
        self._accepting: set[int] = set()
        self._ready_until = 0.0
        self._shutdown_deadline: float | None = None
        self._exit_code = 0
        self._deaths_before_ready = 0
        self._respawns: set[asyncio.TimerHandle] = set()
        self._finished = asyncio.Event()
        self._fallback: ServiceFallback  # set in run()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        for _ in range(self._config.workers):
            self._ensure_spawn()
        # Imported while the workers start: aiohttp takes a few hundred ms to import.
        from aiohttp import web

        from abeja_runtime.server import (
            ControlServer,
            ServiceFallback,
            answer_unavailable,
            make_web_server,
        )

        # Set before the first await: from then on worker messages are handled.
        self._metrics = SupervisorMetrics(__version__, self._config.handler, self._config.style)
        self._fallback = ServiceFallback(
            make_web_server(answer_unavailable, self._config), self._service_socket
        )
        control = ControlServer(self._is_ready, self._metrics.render)
        runner = web.ServerRunner(
            make_web_server(control.handle, self._config), handle_signals=False, shutdown_timeout=1
        )
        await runner.setup()
        await web.SockSite(runner, self._health_socket).start()
        self._refresh()
        ticker = asyncio.create_task(self._watch())
        try:
            await self._finished.wait()
        finally:
            ticker.cancel()
            for worker in self._workers:
                worker.kill()
            self._fallback.stop()
            await runner.cleanup()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        return self._exit_code

    # -- readiness ---------------------------------------------------------------------------

    def _a_worker_serves(self) -> bool:
        now = time.monotonic()
        return not self._draining and any(worker.serving(now) for worker in self._workers)

    def _is_ready(self) -> bool:
        if self._draining:
            return bool(self._accepting) and time.monotonic() < self._ready_until
        return not self._fallback.active and self._a_worker_serves()

    def _refresh(self) -> None:
        """Answer the service port ourselves exactly while no worker is ready."""
        if self._draining or self._a_worker_serves():
            self._fallback.stop()
        else:
            self._fallback.start()

    # -- workers -----------------------------------------------------------------------------

    def _retire(self, worker: _WorkerProcess, reason: str, why: str) -> None:
        """Replace a worker that reached a limit without failing a request: its replacement
        starts now, and it drains (finishing what it has) once that one is ready."""
        if worker.retiring or worker.state != "ready" or self._draining:
            return
        replacement = self._spawn()
        if replacement is None:  # it serves on; the memory check asks again at the next tick
            return
        worker.retiring = True
        replacement.replaces = worker
        _log.info("replacing worker %s: %s", worker.pid, why)
        self._metrics.worker_restarted(reason)

    def _check_memory(self, worker: _WorkerProcess) -> None:
        limit = self._config.max_worker_memory
        if not limit or worker.retiring:
            return
        resident = _resident(worker.pid)
        if resident is not None and resident > limit:
            self._retire(
                worker,
                "memory",
                f"it holds {resident / MiB:.0f} MiB, more than --max-worker-memory "
                f"{limit / MiB:.0f} MiB",
            )

    def _ensure_spawn(self) -> None:
        """Start a worker, or, when the system cannot (no process or descriptor left), try
        again a little later: the service must not stay a worker short."""
        if self._spawn() is None:
            self._spawn_later(_SPAWN_RETRY)

    def _spawn_later(self, delay: float) -> None:
        handle: asyncio.TimerHandle

        def spawn() -> None:
            self._respawns.discard(handle)
            self._ensure_spawn()

        handle = asyncio.get_running_loop().call_later(delay, spawn)
        self._respawns.add(handle)

    def _spawn(self) -> _WorkerProcess | None:
        """A new worker; ``None`` (and an error line) when the system cannot start one."""
        try:
            worker = _WorkerProcess(self._config, self._service_socket)
        except OSError as exc:
            _log.error("cannot start a worker process: %s", exc)
            return None
        self._workers.append(worker)
        loop = asyncio.get_running_loop()
        loop.add_reader(worker.pipe.fileno(), self._on_message, worker)
        if worker.exit_fd is not None:
            loop.add_reader(worker.exit_fd, self._on_exit, worker)
        _log.debug("started worker %s", worker.pid)
        return worker

    def _on_message(self, worker: _WorkerProcess) -> None:
        try:
            message = worker.pipe.recv()
        except (EOFError, OSError):
            self._close_pipe(worker)
            return
        kind = message[0]
        if kind == "heartbeat":
            worker.last_beat = time.monotonic()
            if worker.reported_silent:
                worker.reported_silent = False
                _log.info("worker %s answers again", worker.pid)
            _, age, worker.connections = message
            limit = self._config.stuck_after
            if worker.state == "ready" and limit is not None and age is not None and age > limit:
                self._recycle_stuck(worker)
        elif kind == "ready":
            worker.last_beat = time.monotonic()
            if worker.state == "starting":
                worker.state = "ready"
                self._ever_ready = True
                self._deaths_before_ready = 0
                _log.info("worker %s is ready", worker.pid)
            self._refresh()  # the fallback stops before the worker accepts
            worker.tell(("accept",))
            retired, worker.replaces = worker.replaces, None
            if retired is not None and retired.state == "ready":
                retired.state = "stopping"
                retired.send_signal(signal.SIGTERM)  # it drains: nothing in flight is lost
        if kind in ("heartbeat", "ready"):
            self._rebalance()
        elif kind == "draining":
            self._accepting.discard(worker.pid)
        elif kind == "retire":
            self._retire(worker, "max_requests", f"it has served {message[1]} requests")
        elif kind == "load_failed":
            _, text, details = message
            fields = {"traceback": details.rstrip()} if details else {}
            if self._ever_ready:
                _log.error("worker %s could not load the handler: %s", worker.pid, text)
            else:
                _log.error("failed to setup model: %s", text, extra={"fields": fields})
                self._exit_code = 1
                self._begin_shutdown()
        self._refresh()

    def _rebalance(self) -> None:
        """Ask workers holding well over their share of the connections to close the excess.

        Connections stay with the worker that accepted them, so after a crash every client that
        reconnects lands on a survivor, and the next crash of that survivor would cost them all.
        Closed after a response (``Connection: close``), a connection loses nothing; its client
        reconnects, most likely to the idle worker, which wins the race to accept.
        """
        now = time.monotonic()
        serving = [worker for worker in self._workers if worker.serving(now)]
        if len(serving) < 2:
            return
        share = -(-sum(worker.connections for worker in serving) // len(serving))
        for worker in serving:
            excess = worker.connections - share
            if excess > max(_SHED_SLACK, share // 5) and now >= worker.shed_settles_at:
                worker.tell(("shed", excess))
                worker.shed_settles_at = now + _SHED_SETTLE
                worker.connections = share  # until its next heartbeat says otherwise

    def _close_pipe(self, worker: _WorkerProcess) -> None:
        if not worker.pipe.closed:
            asyncio.get_running_loop().remove_reader(worker.pipe.fileno())
            worker.pipe.close()

    def _recycle_stuck(self, worker: _WorkerProcess) -> None:
        config = self._config
        _log.error(
            "a handler call in worker %s has been running for more than %g s (timeout %g s + "
            "grace %g s); this worker stops taking requests and will be replaced",
            worker.pid,
            config.stuck_after,
            config.timeout,
            config.grace_period,
        )
        worker.state = "stopping"
        worker.send_signal(signal.SIGTERM)  # it drains; the stuck thread dies with it
        self._metrics.worker_restarted("stuck")
        self._ensure_spawn()
        _log.warning("recycling worker %s, whose handler is stuck", worker.pid)

    def _on_exit(self, worker: _WorkerProcess) -> None:
        if worker.exit_fd is not None:
            asyncio.get_running_loop().remove_reader(worker.exit_fd)
            os.close(worker.exit_fd)
        code = worker.process.wait()
        while not worker.pipe.closed and worker.pipe.poll():  # e.g. load_failed, still queued
            self._on_message(worker)
        self._close_pipe(worker)
        self._workers.remove(worker)
        self._accepting.discard(worker.pid)
        if worker.replaces is not None:  # died before it was ready: the retiree may try again
            worker.replaces.retiring = False
        self._metrics.worker_gone(worker.pid)
        if self._draining:
            if not self._workers:
                self._finished.set()
            return
        if worker.state == "starting" and not self._ever_ready:
            _log.error(
                "failed to setup model: the worker exited (%s) while loading the handler",
                _describe_exit(code),
            )
            self._exit_code = 1
            self._begin_shutdown()
            return
        if worker.state == "stopping":  # a recycled worker's replacement exists already
            pass
        elif worker.retiring:  # its replacement is starting already: one more would be extra
            _log.error(
                "worker %s exited unexpectedly (%s); its replacement is starting already",
                worker.pid,
                _describe_exit(code),
            )
            self._metrics.worker_restarted("crashed")
        else:
            self._replace(worker, code)
        self._refresh()

    def _replace(self, worker: _WorkerProcess, code: int | None) -> None:
        if worker.state == "starting":
            self._deaths_before_ready += 1
        delay = _backoff(self._deaths_before_ready)
        when = f" in {delay:g} s (replacements keep dying before they are ready)" if delay else ""
        _log.error(
            "worker %s exited unexpectedly (%s); starting a replacement%s",
            worker.pid,
            _describe_exit(code),
            when,
        )
        self._metrics.worker_restarted("crashed")
        if delay:
            self._spawn_later(delay)
        else:
            self._ensure_spawn()

    async def _watch(self) -> None:
        """Judge heartbeats and the shutdown deadline from outside the workers' loops."""
        limit = self._config.stuck_after
        while True:
            await asyncio.sleep(_TICK)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.exit_fd is None and worker.process.poll() is not None:
                    self._on_exit(worker)  # no pidfd on this system to tell us
                    continue
                if worker.state != "ready":
                    continue
                self._check_memory(worker)
                silent = now - worker.last_beat
                if limit is not None and silent > limit:
                    _log.error(
                        "worker %s has not answered for %.0f s (timeout + grace): its event loop "
                        "is blocked, e.g. by an async handler that does not await; killing it",
                        worker.pid,
                        silent,
                    )
                    worker.state = "stopping"
                    worker.kill()
                    self._metrics.worker_restarted("blocked")
                    self._ensure_spawn()
                elif silent > _UNRESPONSIVE_AFTER and not worker.reported_silent:
                    worker.reported_silent = True
                    _log.warning(
                        "worker %s has not answered for %.0f s; it does not count as ready "
                        "until it does",
                        worker.pid,
                        silent,
                    )
            if self._shutdown_deadline is not None and now >= self._shutdown_deadline:
                for worker in self._workers:
                    _log.warning("worker %s did not stop in time; killing it", worker.pid)
                    worker.kill()
                self._shutdown_deadline = None
            self._refresh()

    # -- shutdown ----------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if not self._draining:
            _log.info("signal %s received; shutting down gracefully", signal.Signals(signum).name)
            self._begin_shutdown()
        else:
            _log.warning("second signal received; stopping at once")
            for worker in self._workers:
                worker.kill()
            self._exit_code = 1

    def _begin_shutdown(self) -> None:
        if self._draining:
            return
        self._draining = True
        self._accepting = {worker.pid for worker in self._workers if worker.state == "ready"}
        self._ready_until = time.monotonic() + _STOP_ACCEPTING_WAIT
        for handle in self._respawns:
            handle.cancel()
        self._respawns.clear()
        self._fallback.stop()
        # The service port refuses connections once every worker has closed its copy too.
        self._service_socket.close()
        self._shutdown_deadline = time.monotonic() + self._config.grace_period + _KILL_MARGIN
        for worker in self._workers:
            worker.state = "stopping"
            worker.send_signal(signal.SIGTERM)
        if not self._workers:
            self._finished.set()


def _resident(pid: int) -> int | None:
    """A process's resident memory in bytes (Linux); ``None`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def _backoff(deaths_before_ready: int) -> float:
    if deaths_before_ready <= 1:
        return 0.0
    return float(min(_MAX_BACKOFF, 0.5 * 2 ** (deaths_before_ready - 2)))


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
