"""The front process's start (``run(config)``): its log, its working folder, the ports bound,
the first handler process's interpreter started (``interpreter.py``) before this process imports
its loop, its pool and its servers (so that the two imports overlap: none is imported at the
top), then the front at work (``serving.py``) until it stops; the exit code.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import signal
import socket
import tempfile
from typing import Final

from abeja_runtime import __version__
from abeja_runtime.config import Config, MiB
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.front.api_keys import ApiKeys, api_keys
from abeja_runtime.front.interpreter import Prestarted
from abeja_runtime.front.ports import listen
from abeja_runtime.front.run_folder import run_folder
from abeja_runtime.logs import configure_logging
from abeja_runtime.metrics import handler_environment
from abeja_runtime.project import install_dependencies, prepare_workdir
from abeja_runtime.scheduling import run_as_batch

__all__ = ["SIGNALS", "run"]

_log = logging.getLogger("abeja_runtime")
#: What the front does at a signal: a stop (SIGTERM, SIGINT: the drain), a reload (SIGHUP).
SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run(config: Config) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit code."""
    configure_logging(config.log_level, config.platform.log_fields(), log_format=config.log_format)
    try:
        tempfile.gettempdir()  # metrics files and request bodies above the spool threshold
        keys = api_keys(config)
    except FileNotFoundError:
        _log.error(
            "cannot start: no writable temporary directory (TMPDIR, /tmp, /var/tmp); in a "
            "read-only container mount one on /tmp (docker run --read-only --tmpfs /tmp, or an "
            "emptyDir volume on /tmp in Kubernetes), or set TMPDIR to a writable folder"
        )
        return 1
    except ValueError as exc:  # the API keys' file
        _log.error("cannot start: %s", exc)
        return 1
    # The keys are ``keys``' alone from here: not in what the handler processes are sent.
    config = dataclasses.replace(config, api_keys="", api_keys_file="")
    workdir = prepare_workdir(config.user_model_root, config.training_result_dir, config.handler)
    try:
        if config.install_requirements:
            install_dependencies(workdir)
    except (HandlerLoadError, OSError) as exc:
        _log.error("failed to setup model: %s", exc)
        return 1
    sockets = _bind(config)
    if sockets is None:
        return 1
    # From here, until the loop handles them, a stop is held for the drain (until here, an
    # --install-requirements that takes minutes still stops at once).
    arrived = _hold_signals()
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
    _say_keys(keys)
    _keep_freed_memory()
    run_as_batch()
    try:
        with run_folder() as folder:
            metrics_dir = str(folder / "metrics")
            prestarted = _prestart(config, handler_environment(metrics_dir))
            try:
                from abeja_runtime.front.serving import Front

                main = Front(config, sockets, metrics_dir, prestarted, arrived, keys).run()
                if config.event_loop == "uvloop":
                    import uvloop

                    return int(uvloop.run(main))
                import asyncio

                return asyncio.run(main)
            finally:
                if prestarted is not None:
                    prestarted.discard()  # (when the front failed before a process took it)
    finally:
        for sock in sockets:
            sock.close()


def _bind(config: Config) -> tuple[socket.socket, socket.socket] | None:
    """The service and health-check ports, listening; ``None`` when one cannot be (said)."""
    listening: list[socket.socket] = []
    try:
        listening.append(listen(config.host, config.port, "port"))
        listening.append(listen(config.host, config.healthcheck_port, "healthcheck_port"))
        if config.grpc_port is not None:  # bound once the handler loaded: a port in use is said now
            listen(config.host, config.grpc_port, "grpc_port").close()
    except OSError as exc:  # one sentence, naming the port and the setting that changes it
        _log.error("%s", exc)
        for sock in listening:
            sock.close()
        return None
    return listening[0], listening[1]


def _say_keys(keys: ApiKeys | None) -> None:
    if keys is None:
        _log.info("no API key is asked: every caller that reaches the service port is served")
    else:
        _log.info(
            "API keys: the service port and gRPC serve callers that send one of the %d key(s) "
            "given; the health port and /health_check ask for none",
            len(keys),
        )


def _hold_signals() -> list[int]:
    """The stop and reload signals that arrive before the front's loop handles them, in order,
    for it (``serving.py``): a stop is a drain then, not the end of the process at once."""
    arrived: list[int] = []
    for signum in SIGNALS:
        signal.signal(signum, lambda signum, frame: arrived.append(signum))
    return arrived


def _prestart(config: Config, environment: dict[str, str]) -> Prestarted | None:
    """The first handler process's interpreter; none where that process needs another
    environment (a worker's ``--devices``), or where it cannot start now (the pool tries again,
    and says why)."""
    if config.devices and not config.preload:
        return None
    try:
        return Prestarted(environment)
    except OSError:
        return None


def _keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory the front frees for its next requests, rather than
    give large blocks back at once (each big request body paid again in page faults)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-3, 4 * MiB)  # M_MMAP_THRESHOLD: blocks below it come from the heap,
    mallopt(-1, 64 * MiB)  # M_TRIM_THRESHOLD: which keeps this much free before it returns any
