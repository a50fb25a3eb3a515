"""The front at work (:class:`Front`): its servers on the bound ports, readiness, the handler
processes' pool, and the drain at SIGTERM.

``Front.run`` starts ``workers`` handler processes (``pool.py``) and serves HTTP itself
(``server.py``), and gRPC (``rpc.py``), so readiness, liveness, ``/metrics``, the access log,
deadlines and the queue answer whatever a handler does. While no handler process is ready the
service port answers ``503``; a handler that cannot be loaded at the very first start stops the
front (exit 1), as on ABEJA Platform.

SIGTERM: readiness says 503 at once, but for ``--drain-delay`` seconds the front goes on
answering whatever arrives (on connections old and new, and gRPC), each answer with
``Connection: close``: a balancer learns of the stop only from readiness, seconds later
(``benchmarks/drain.py``). Then the service port stops accepting; once the requests on
connections still open are answered (or the grace period has passed) the handler processes are
told to finish, and the front exits. SIGINT (a Ctrl+C) skips the delay, as does a front that was
never ready. A second signal kills the handler processes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import signal
import socket
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime import __version__
from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError, ServiceUnavailable
from abeja_runtime.front.api_keys import ApiKeys
from abeja_runtime.front.interpreter import Prestarted
from abeja_runtime.front.pool import HandlerPool
from abeja_runtime.front.supervisor import SIGNALS

if TYPE_CHECKING:
    from abeja_runtime.front.accounting import Accounting
    from abeja_runtime.front.rpc import RpcServer
    from abeja_runtime.front.service import CallService
    from abeja_runtime.front.web_server import SocketServer

__all__ = ["KILL_MARGIN", "Front"]

_log = logging.getLogger("abeja_runtime")
#: Extra seconds past the grace period before handler processes are killed at shutdown.
KILL_MARGIN: Final = 5.0
#: While draining, how often a connection accepted just before the stop is looked at again.
_FRESH_CONNECTION_POLL: Final = 0.02
#: The modules that serve HTTP, imported while the handler processes start (``Front.run``).
_SERVER_MODULES: Final = (
    "abeja_runtime.front.direct",
    "abeja_runtime.front.server",
    "abeja_runtime.front.service",
    "abeja_runtime.front.web_server",
)


class Front:
    """The front at work, from its servers' start to the end of its drain (see the module)."""

    def __init__(
        self,
        config: Config,
        sockets: tuple[socket.socket, socket.socket],
        metrics_dir: str,
        prestarted: Prestarted | None = None,
        arrived: list[int] | None = None,
        keys: ApiKeys | None = None,
    ) -> None:
        """``prestarted``: the first handler process's interpreter, started already;
        ``arrived``: the signals (of :data:`SIGNALS`) that came before the loop handled them;
        ``keys``: the API keys callers must send (``None``: none is asked)."""
        self._arrived = arrived or []
        self._keys = keys
        self._config = config
        self._service_socket, self._health_socket = sockets
        self._metrics_dir = metrics_dir
        self._exit_code = 0
        self._finished = asyncio.Event()
        self._draining = False
        #: Seconds the front still answers after the signal (see the module).
        self._delay = 0.0
        self._killed = False
        self._rpc: RpcServer | None = None
        self._service: CallService | None = None
        self._service_server: SocketServer | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._rpc_starting: asyncio.Task[None] | None = None
        self._prestarted = prestarted

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        config = self._config
        pool = self._pool = HandlerPool(
            config,
            self._metrics_dir,
            self._on_first_ready,
            self._on_load_failed,
            prestarted=self._prestarted,
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, pool.lifecycle.reload)
        for arrived in self._arrived:  # before the loop handled signals: the same now
            if arrived == signal.SIGHUP:
                pool.lifecycle.reload()
            else:
                self._on_signal(arrived)
        servers: list[SocketServer] = []
        try:
            pool.start()
            await self._serve(pool, servers)
        finally:
            pool.close()
            for server in servers:
                await server.close()
            if self._service is not None:
                self._service.accounting.close()  # the access records kept, the spans buffered
            for signum in SIGNALS:
                loop.remove_signal_handler(signum)
        return self._exit_code

    async def _serve(self, pool: HandlerPool, servers: list[SocketServer]) -> None:
        """The servers on the ports (each added to ``servers`` as it is made), until the stop
        and its drain."""
        config = self._config
        from abeja_runtime.metrics import FrontMetrics

        metrics = FrontMetrics(
            __version__, config.handler, config.style, self._metrics_dir, self._gauges
        )
        pool.scheduler.metrics = pool.lifecycle.metrics = metrics
        if config.max_batch_size > 1:
            metrics.batching()  # its metrics at 0 from the first scrape
        # The servers' modules are imported in a thread (aiohttp takes a while), so that the
        # loop goes on with the handler processes' start meanwhile: the template's fork, the
        # first worker's warm-up. A signal may come meanwhile.
        await asyncio.get_running_loop().run_in_executor(None, _import_all, _SERVER_MODULES)
        from abeja_runtime.front.direct import DirectRequests
        from abeja_runtime.front.server import ControlServer, HttpServer
        from abeja_runtime.front.service import CallService
        from abeja_runtime.front.web_server import SocketServer, make_web_server

        call_service = self._service = CallService(config, pool, metrics, self._keys)
        call_service.draining = self._draining
        if pool.lifecycle.ever_ready:  # a worker was ready before the service existed
            self._on_first_ready()
        http = HttpServer(config, pool, metrics, call_service)
        control = ControlServer(self._is_ready, metrics.render)
        direct = DirectRequests(
            call_service, http.own_path, config.max_body_size, config.spool_threshold
        )
        service = self._service_server = SocketServer(
            make_web_server(http.service, config, metrics, direct), self._service_socket
        )
        health = SocketServer(make_web_server(control.handle, config, metrics), self._health_socket)
        servers += (service, health)
        if self._service_socket.fileno() != -1:  # (closed by a stop that came first)
            await service.start()
        await health.start()
        # What the start made (the modules, the servers) lives as long as the front: left out
        # of the collector's passes (its garbage collected first), a full one takes a
        # millisecond, not tens (each a pause of every call in flight).
        gc.collect()
        gc.freeze()
        if not self._finished.is_set():
            pool.lifecycle.start_up.listening(metrics)
        await self._finished.wait()
        if self._draining and not self._killed:
            self._drainer = asyncio.create_task(self._drain(service))
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer

    def _gauges(self) -> tuple[int, int]:
        """Requests in flight and calls queued, for a scrape."""
        in_flight = self._service.accounting.in_flight if self._service is not None else 0
        return in_flight, self._pool.queued

    def _is_ready(self) -> bool:
        """Ready: a worker takes calls, and the gRPC port, when one is asked for, listens (its
        clients are sent here once the readiness probe passes)."""
        grpc_open = self._config.grpc_port is None or self._rpc is not None
        return not self._draining and self._pool.serving and grpc_open

    def _on_first_ready(self) -> None:
        """Once a worker is ready, the gRPC port (when asked for) opens, as soon as the service
        it calls through exists."""
        if self._config.grpc_port is not None and self._service is not None:
            self._rpc_starting = asyncio.create_task(self._start_rpc())

    def _on_load_failed(self, text: str, details: str) -> None:
        fields = {"traceback": details.rstrip()} if details else {}
        _log.error("failed to setup model: %s", text, extra={"fields": fields})
        self._exit_code = 1
        self._killed = True
        self._finished.set()

    async def _start_rpc(self) -> None:
        """The gRPC port, once the first handler process said which methods its style has."""
        config = self._config
        assert config.grpc_port is not None
        lifecycle = self._pool.lifecycle
        if not lifecycle.rpc_methods:
            self._on_load_failed(
                "--grpc-port serves the gRPC protocol of KServe (Open Inference) or of Seldon "
                f"Core, which the {lifecycle.style} style does not have; serve a kserve.Model or a "
                "Seldon component, or leave --grpc-port (ABEJA_RUNTIME_GRPC_PORT) unset",
                "",
            )
            return
        from abeja_runtime.front.rpc import RpcServer  # grpcio only when a gRPC port is asked for

        assert self._service is not None
        try:
            rpc = RpcServer(config, self._service, lifecycle.rpc_methods)
        except HandlerLoadError as exc:
            self._on_load_failed(str(exc), "")
            return
        await rpc.start()
        if self._draining:  # a signal came while it started: the drain did not see it
            await rpc.stop(self._config.grace_period)
            return
        self._rpc = rpc
        _log.info("serving gRPC on %s:%d", config.host, config.grpc_port)

    async def _drain(self, service: SocketServer) -> None:
        """The drain (see the module) after the signal; cancelled by a second signal."""
        if self._delay:
            await asyncio.sleep(self._delay)
            self._stop_accepting()
        assert self._service is not None
        grace = self._config.grace_period
        _log.info(
            "%sthe service port stops accepting; %d request(s) in flight, and any that arrive "
            "on connections still open, are answered within the grace period (%s)",
            f"drain delay of {self._delay:g} s over: " if self._delay else "",
            self._service.accounting.in_flight,
            f"{grace:g} s" if grace else "no limit",
        )
        rpc_stopped = asyncio.ensure_future(self._rpc.stop(grace)) if self._rpc else None
        left = await self._answer_open(service, self._service.accounting)
        if rpc_stopped is not None:
            await rpc_stopped
        self._service.accounting.flush()  # the answers' records before what the workers log
        lifecycle = self._pool.lifecycle
        lifecycle.stop()
        try:  # within the grace period (what is left of it), then the margin: not twice it
            await asyncio.wait_for(lifecycle.all_gone.wait(), left + KILL_MARGIN)
        except asyncio.TimeoutError:
            for member in lifecycle.members:
                _log.warning("worker %s did not stop in time; killing it", member.pid)
            lifecycle.kill_all()
        # Every call ends, and is recorded, before the servers close their connections (as
        # clients' leaving): those of the workers killed as their exits are seen (502), those
        # still queued now, as no process will run them.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(lifecycle.all_gone.wait(), KILL_MARGIN)
        self._pool.scheduler.fail_queue(
            ServiceUnavailable(
                "service unavailable: the service stopped before this request could run; "
                "send it again"
            )
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._service.accounting.idle(), KILL_MARGIN)

    async def _answer_open(self, service: SocketServer, calls: Accounting) -> float:
        """Until the ``calls`` in flight are answered and no connection accepted just before the
        stop still waits for its request, within the grace period; the seconds left of it."""
        loop = asyncio.get_running_loop()
        grace = self._config.grace_period
        deadline = loop.time() + grace if grace else None
        while calls.in_flight or _fresh(service.server):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                _log.warning(
                    "%d request(s) still running after the %g s grace period; stopping anyway",
                    calls.in_flight,
                    grace,
                )
                break
            if calls.in_flight:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(calls.idle(), left)
            else:
                await asyncio.sleep(_FRESH_CONNECTION_POLL)
        return 0.0 if deadline is None else max(0.0, deadline - loop.time())

    def _on_signal(self, signum: int) -> None:
        if not self._draining:
            self._draining = True
            if self._service is not None:
                self._service.draining = True  # readiness 503; every answer closes its connection
                # The access records of the answers given so far (written in batches) come
                # before the lines of the stop: run-local stops it as soon as its answer came.
                self._service.accounting.flush()
            # A Ctrl+C is someone at a terminal; a front never ready had no balancer sending.
            if signum == signal.SIGTERM and self._pool.lifecycle.ever_ready:
                self._delay = self._config.drain_delay
            name = signal.Signals(signum).name
            if self._delay:
                _log.info(
                    "signal %s received; shutting down gracefully: readiness says 503 from now "
                    "on, and requests are still answered for %g s (--drain-delay), each with "
                    "Connection: close, so that load balancers stop sending before the service "
                    "port stops accepting",
                    name,
                    self._delay,
                )
            else:  # no delay: the port stops accepting now, as readiness begins to say 503
                _log.info("signal %s received; shutting down gracefully", name)
                self._stop_accepting()
            self._finished.set()
        else:
            _log.warning("second signal received; stopping at once")
            self._pool.lifecycle.kill_all()
            self._killed = True
            self._exit_code = 1
            if self._drainer is not None:
                self._drainer.cancel()

    def _stop_accepting(self) -> None:
        """The service port refuses new connections; those open stay, and are answered."""
        if self._service_server is not None:
            self._service_server.stop_accepting()
        self._service_socket.close()


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        importlib.import_module(name)


def _fresh(server: Any) -> bool:
    """Whether a connection has been accepted whose first request has not arrived yet."""
    return any(getattr(handler, "fresh", False) for handler in server.connections)
