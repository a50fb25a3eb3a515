"""One worker process: serve both ports, load the handler, drain on SIGTERM, report upwards.

The worker starts answering (503) before the handler is imported, so that a slow import is
visible to health checks; the import runs on the first slot's thread, the thread that will call
the handler. Messages to the supervisor go through a pipe: ``ready``, ``load_failed`` and
``stuck`` (a handler ran past timeout + grace: the worker stops taking work so that the
supervisor can replace it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Final

from aiohttp import web

from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.execute import Executor
from abeja_runtime.loader import load_handler
from abeja_runtime.logs import capture_prints, configure_logging
from abeja_runtime.server import HttpServer, ServingState, make_web_server

__all__ = ["run_worker"]

_log = logging.getLogger("abeja_runtime")
#: How long a thread may hold the GIL while another waits for it. The default 5 ms lets the event
#: loop keep a freshly woken handler thread waiting for up to 5 ms per hand-off; measured on this
#: machine kind (small JSON, wrk -c16, server pinned to one core): default p99 108-383 ms,
#: 1 ms: p99 6.5 ms and 15-20 % more requests/s. Shorter intervals gained nothing more.
_GIL_SWITCH_INTERVAL: Final = 0.001
_ORPHAN_CHECK_INTERVAL: Final = 0.5


def run_worker(
    config: Config,
    service_socket: socket.socket,
    health_socket: socket.socket,
    pipe: Connection,
    accept_early: bool,
) -> None:
    """Process entry point; ``os._exit`` at the end, so a stuck handler thread cannot hold it."""
    configure_logging(config.log_level, config.platform.log_fields())
    capture_prints()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the supervisor, which decides
    sys.setswitchinterval(_GIL_SWITCH_INTERVAL)
    try:
        code = asyncio.run(_Worker(config, service_socket, health_socket, pipe).serve(accept_early))
    except Exception:
        _log.exception("the worker failed")
        code = 1
    logging.shutdown()
    os._exit(code)


class _Worker:
    def __init__(
        self,
        config: Config,
        service_socket: socket.socket,
        health_socket: socket.socket,
        pipe: Connection,
    ) -> None:
        self._config = config
        self._sockets = (service_socket, health_socket)
        self._pipe = pipe
        self._state = ServingState()
        self._stop = asyncio.Event()

    async def serve(self, accept_early: bool) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        # Kept referenced for the life of the worker; asyncio.run cancels it at the end.
        self._orphan_watch = asyncio.create_task(_exit_when_orphaned(os.getppid()))
        config = self._config
        executor = Executor(
            concurrency=config.concurrency, max_queue=config.max_queue, timeout=config.timeout
        )
        http = HttpServer(config, executor, self._state)
        # In-flight requests get the grace period in _drain; cleanup only closes what is left.
        runners = [
            web.ServerRunner(make_web_server(handler), handle_signals=False, shutdown_timeout=1)
            for handler in (http.service, http.health)
        ]
        for runner in runners:
            await runner.setup()
        sites = [
            web.SockSite(runner, sock) for runner, sock in zip(runners, self._sockets, strict=True)
        ]
        if accept_early:
            for site in sites:
                await site.start()
            self._pipe.send(("accepting",))
        try:
            self._state.handler = await executor.run_on_thread(
                load_handler, config.handler, Path.cwd(), config
            )
        except Exception as exc:
            details = "" if isinstance(exc, HandlerLoadError) else traceback.format_exc()
            cause = exc.__cause__
            if isinstance(exc, HandlerLoadError) and cause is not None:
                details = "".join(traceback.format_exception(cause))
            self._pipe.send(("load_failed", str(exc), details))
            await _cleanup(runners)
            return 1
        if not accept_early:
            for site in sites:
                await site.start()
        self._pipe.send(("ready",))
        watchdog = asyncio.create_task(self._watch_for_stuck_handler(executor, sites))
        await self._stop.wait()
        watchdog.cancel()
        await self._drain(executor, runners[0], sites[0])
        await _cleanup(runners)
        executor.stop_threads()
        return 0

    async def _drain(
        self, executor: Executor, service_runner: web.BaseRunner, service_site: web.BaseSite
    ) -> None:
        """Stop accepting, answer health with 503, give in-flight requests the grace period."""
        self._state.draining = True
        executor.close()
        if service_site in service_runner.sites:  # a stuck worker has stopped it already
            await service_site.stop()
        if self._state.in_flight:
            idle = asyncio.get_running_loop().create_future()
            self._state.idle_waiters.append(idle)
            try:
                await asyncio.wait_for(idle, self._config.grace_period or None)
            except asyncio.TimeoutError:  # not the builtin one before Python 3.11
                _log.warning(
                    "%d request(s) still running after the %g s grace period; stopping anyway",
                    self._state.in_flight,
                    self._config.grace_period,
                )

    async def _watch_for_stuck_handler(self, executor: Executor, sites: list[web.BaseSite]) -> None:
        limit = self._config.stuck_after
        if limit is None:
            return
        interval = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(interval)
            started = executor.oldest_call_started()
            if started is not None and time.monotonic() - started > limit:
                break
        _log.error(
            "a handler call has been running for more than %g s (timeout %g s + grace %g s); "
            "this worker stops taking requests and will be replaced",
            limit,
            self._config.timeout,
            self._config.grace_period,
        )
        self._state.draining = True
        executor.close()
        for site in sites:
            await site.stop()
        self._pipe.send(("stuck",))


async def _exit_when_orphaned(supervisor_pid: int) -> None:
    """A supervisor killed outright (SIGKILL, OOM) must not leave its workers serving.

    The parent pid changes when the parent dies; a check twice a second costs nothing and works
    on every POSIX system (``parent_process().sentinel`` does not, under the spawn method).
    """
    while os.getppid() == supervisor_pid:
        await asyncio.sleep(_ORPHAN_CHECK_INTERVAL)
    _log.error("the supervisor process is gone; this worker exits")
    logging.shutdown()
    os._exit(1)


async def _cleanup(runners: list[web.ServerRunner]) -> None:
    for runner in runners:
        await runner.cleanup()
