"""One worker process: load the handler, then serve the service port; drain on SIGTERM.

A worker takes no connection before its handler is loaded: until some worker is ready the
supervisor answers the service port itself (503), so a loading worker never refuses traffic
that a ready one could serve. The import runs on the first slot's thread, the thread that will
call the handler. Once it is loaded the worker says ``ready`` and starts accepting when the
supervisor answers ``accept`` (it has stopped answering the service port itself by then).
Messages to the supervisor go through a pipe: ``ready``, ``load_failed``, and
a ``heartbeat`` twice a second carrying how long the oldest handler call has been running and
how many connections the worker holds; the supervisor may answer ``shed`` (close that many
connections after their next response) when this worker holds more than its share. The
heartbeat comes from the event loop, so its silence tells the supervisor that the loop is
blocked (an ``async def`` handler that never awaits); the age tells it that a handler thread is
stuck. Both decisions are the supervisor's, taken from outside this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import random
import signal
import socket
import sys
import traceback
from collections.abc import Coroutine
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.execute import Executor
from abeja_runtime.handler import LoadedHandler
from abeja_runtime.lifecycle import Lifecycle, ServingState
from abeja_runtime.loader import load_handler
from abeja_runtime.logs import capture_prints, configure_logging, user_traceback
from abeja_runtime.metrics import WorkerMetrics
from abeja_runtime.pixels import limit_image_pixels
from abeja_runtime.server import HttpServer, make_web_server

if TYPE_CHECKING:
    from abeja_runtime.rpc import RpcServer

__all__ = ["run_worker"]

_log = logging.getLogger("abeja_runtime")
#: How long a thread may hold the GIL while another waits for it. The default 5 ms lets the event
#: loop keep a freshly woken handler thread waiting for up to 5 ms per hand-off; measured on this
#: machine kind (small JSON, wrk -c16, server pinned to one core): default p99 108-383 ms,
#: 1 ms: p99 6.5 ms and 15-20 % more requests/s. Shorter intervals gained nothing more.
_GIL_SWITCH_INTERVAL: Final = 0.001
_ORPHAN_CHECK_INTERVAL: Final = 0.5
#: Seconds between heartbeats; the supervisor's judgements (supervisor._UNRESPONSIVE_AFTER,
#: timeout + grace) are several of these.
_HEARTBEAT_INTERVAL: Final = 0.5
#: While draining, how often a connection accepted just before the stop is looked at again.
_FRESH_CONNECTION_POLL: Final = 0.02
#: The longest a handler's teardown may take at shutdown when the grace period is 0.
_HANDLER_STOP_WAIT: Final = 5.0
#: How long a loaded worker waits for the supervisor's ``accept`` (it comes at once).
_ACCEPT_WAIT: Final = 10.0


def main() -> None:
    """``python -m abeja_runtime.worker SERVICE_FD PIPE_FD``, as the supervisor starts it."""
    service_fd, pipe_fd = (int(arg) for arg in sys.argv[1:3])
    for fd in (service_fd, pipe_fd):
        os.set_inheritable(fd, False)  # the handler's own subprocesses get neither
    pipe = Connection(pipe_fd)
    config: Config = pipe.recv()
    run_worker(config, socket.socket(fileno=service_fd), pipe)


def run_worker(config: Config, service_socket: socket.socket, pipe: Connection) -> None:
    """Process entry point; ``os._exit`` at the end, so a stuck handler thread cannot hold it."""
    configure_logging(config.log_level, config.platform.log_fields())
    capture_prints()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the supervisor, which decides
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL)
    limit_image_pixels(config.max_image_pixels)
    try:
        code = _run(_Worker(config, service_socket, pipe).serve(), config.event_loop)
    except Exception:
        _log.exception("the worker failed")
        code = 1
    logging.shutdown()
    os._exit(code)


def _run(main: Coroutine[Any, Any, int], loop: str) -> int:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


class _Worker:
    def __init__(self, config: Config, service_socket: socket.socket, pipe: Connection) -> None:
        self._config = config
        self._socket = service_socket
        self._pipe = pipe
        self._state = ServingState(concurrency=config.concurrency, max_queue=config.max_queue)
        if config.max_requests:  # a little more for some, so that workers retire apart
            self._state.request_limit = config.max_requests + random.randint(
                0, config.max_requests // 10
            )
            self._state.on_request_limit = self._request_limit_reached
        self._stop = asyncio.Event()
        #: Set when the supervisor, told that the handler is loaded, lets this worker accept.
        self._accept: asyncio.Future[None] | None = None

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        accept = self._accept = loop.create_future()
        # Kept referenced for the life of the worker; asyncio.run cancels it at the end.
        self._orphan_watch = asyncio.create_task(_exit_when_orphaned(os.getppid()))
        config = self._config
        executor = Executor(threads=config.concurrency)
        metrics = WorkerMetrics()
        lifecycle = Lifecycle(config, executor, self._state, metrics)
        http = HttpServer(lifecycle)
        # In-flight requests get the grace period in _drain; cleanup only closes what is left.
        runner = web.ServerRunner(
            make_web_server(http.service, config), handle_signals=False, shutdown_timeout=1
        )
        await runner.setup()
        try:
            handler = await executor.run_on_thread(load_handler, config.handler, Path.cwd(), config)
            rpc = await _start_rpc(lifecycle, config, handler)
            self._state.handler = handler
        except Exception as exc:
            details = "" if isinstance(exc, HandlerLoadError) else traceback.format_exc()
            cause = exc.__cause__
            if isinstance(exc, HandlerLoadError) and cause is not None:
                details = user_traceback(cause)
            self._pipe.send(("load_failed", str(exc), details))
            await runner.cleanup()
            return 1
        # Ready first, accepting once the supervisor says so: it stops answering the service
        # port itself before, so no new connection can reach its 503 after a client has seen
        # this worker answer (a CLI that saw /health_check say 200 got 503 for its request).
        loop.add_reader(self._pipe.fileno(), self._on_supervisor_message)
        self._pipe.send(("ready",))
        try:
            await asyncio.wait_for(accept, _ACCEPT_WAIT)
        except asyncio.TimeoutError:  # not the builtin one before Python 3.11
            _log.warning("the supervisor did not answer 'ready' in %g s; accepting", _ACCEPT_WAIT)
        site = web.SockSite(runner, self._socket)
        await site.start()
        self._heartbeat = asyncio.create_task(self._beat(executor, metrics, runner))
        await self._stop.wait()
        await self._drain(site, rpc, runner)
        await self._stop_handler(executor)
        await runner.cleanup()
        executor.stop_threads()
        return 0

    async def _beat(
        self, executor: Executor, metrics: WorkerMetrics, runner: web.ServerRunner
    ) -> None:
        server = runner.server
        assert server is not None  # set up before the first beat
        while True:
            metrics.sample(self._state.in_flight, self._state.queued)
            try:
                message = ("heartbeat", executor.oldest_call_age(), len(server.connections))
                self._pipe.send(message)
            except OSError:  # the supervisor is gone; the orphan watch ends this process
                return
            await asyncio.sleep(_HEARTBEAT_INTERVAL)

    def _request_limit_reached(self) -> None:
        """Asks for a replacement; this worker serves on until the supervisor drains it."""
        with contextlib.suppress(OSError):
            self._pipe.send(("retire", self._state.answered))

    def _on_supervisor_message(self) -> None:
        try:
            message = self._pipe.recv()
        except (EOFError, OSError):  # the supervisor is gone; the orphan watch ends this process
            asyncio.get_running_loop().remove_reader(self._pipe.fileno())
            return
        if message[0] == "shed":
            self._state.shed = message[1]
        elif message[0] == "accept" and self._accept is not None and not self._accept.done():
            self._accept.set_result(None)

    async def _drain(
        self, site: web.BaseSite, rpc: RpcServer | None, runner: web.ServerRunner
    ) -> None:
        """Stop accepting, answer health with 503, give in-flight requests the grace period.

        A connection accepted just before the stop whose request has not arrived yet is
        waited for too (its request is on the way; closing it would leave the client without
        an answer); it is answered with ``Connection: close``, like every request now.
        """
        self._state.draining = True
        await site.stop()
        # gRPC refuses new calls at once; running ones are waited for with the others below.
        rpc_stopped = asyncio.ensure_future(rpc.stop(self._config.grace_period)) if rpc else None
        with contextlib.suppress(OSError):  # the supervisor holds readiness 200 until this
            self._pipe.send(("draining",))
        loop = asyncio.get_running_loop()
        grace = self._config.grace_period
        deadline = loop.time() + grace if grace else None
        server = runner.server
        while self._state.in_flight or (server is not None and _fresh(server)):
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                _log.warning(
                    "%d request(s) still running after the %g s grace period; stopping anyway",
                    self._state.in_flight,
                    grace,
                )
                break
            if self._state.in_flight:
                idle = loop.create_future()
                self._state.idle_waiters.append(idle)
                with contextlib.suppress(asyncio.TimeoutError):  # the loop checks the deadline
                    await asyncio.wait_for(idle, left)
            else:
                await asyncio.sleep(_FRESH_CONNECTION_POLL)
        if rpc_stopped is not None:
            await rpc_stopped  # within the grace period too; at once when no call is left

    async def _stop_handler(self, executor: Executor) -> None:
        """The style's teardown (KServe's ``Model.stop()``), after the last request, on the
        handler thread; within the grace period, and a failure is only logged."""
        handler = self._state.handler
        if handler is None or handler.stop is None:
            return
        wait = self._config.grace_period or _HANDLER_STOP_WAIT
        try:
            result = await asyncio.wait_for(executor.run_on_thread(handler.stop), wait)
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, wait)
        except Exception:
            _log.exception("stopping the handler %s failed", handler.name)


def _fresh(server: web.Server) -> bool:
    """Whether a connection has been accepted whose first request has not arrived yet."""
    return any(getattr(handler, "fresh", False) for handler in server.connections)


async def _start_rpc(
    lifecycle: Lifecycle, config: Config, handler: LoadedHandler
) -> RpcServer | None:
    """The gRPC port, when asked for; a style without a gRPC protocol cannot serve it."""
    if config.grpc_port is None:
        return None
    if handler.rpc is None:
        raise HandlerLoadError(
            "--grpc-port serves KServe's Open Inference gRPC protocol, which the "
            f"{handler.style} style does not have; serve a kserve.Model, or leave --grpc-port "
            "(ABEJA_RUNTIME_GRPC_PORT) unset"
        )
    from abeja_runtime.rpc import RpcServer  # grpcio only when a gRPC port is asked for

    rpc = RpcServer(lifecycle, config, handler.rpc)
    await rpc.start()
    _log.info("serving gRPC on %s:%d", config.host, config.grpc_port)
    return rpc


async def _exit_when_orphaned(supervisor_pid: int) -> None:
    """A supervisor killed outright (SIGKILL, OOM) must not leave its workers serving.

    The parent pid changes when the parent dies; a check twice a second costs nothing and works
    on every POSIX system.
    """
    while os.getppid() == supervisor_pid:
        await asyncio.sleep(_ORPHAN_CHECK_INTERVAL)
    _log.error("the supervisor process is gone; this worker exits")
    logging.shutdown()
    os._exit(1)


if __name__ == "__main__":
    main()
