"""A handler process (``python -m abeja_runtime.worker FD FRONT_PID``), started by the front
(``front/processes.py``) with its end of a socket pair (``frames.py``): it loads the handler
(``loader.py``), warms it up (``warmup.py``), says :class:`~abeja_runtime.frames.Ready`, and runs
the calls (``runner.py``) on the executor chosen at start (``executors.py``, ``event_loop.py``).

Every decision about this process's life is the front's: SIGTERM and SIGINT are ignored, and the
front closing the socket means "stop": the handler's teardown runs, and the process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
import traceback
from typing import Final, NoReturn

from abeja_runtime.batched import declared_batch
from abeja_runtime.config import Config
from abeja_runtime.errors import HandlerLoadError
from abeja_runtime.frames import (
    EXIT_WARMUP_FAILED,
    VERSION,
    BlockingChannel,
    LoadFailed,
    ProtocolError,
    Ready,
    Start,
)
from abeja_runtime.logs import capture_prints, configure_logging, user_traceback
from abeja_runtime.pixels import limit_image_pixels
from abeja_runtime.scheduling import run_as_batch
from abeja_runtime.styles import LoadedHandler
from abeja_runtime.tracing import Tracing, tracing_from
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.credits import StreamCredits
from abeja_runtime.worker.executors import Executor, MainThread, Threads
from abeja_runtime.worker.invoke import Invoker, finish, settled
from abeja_runtime.worker.loader import load_handler
from abeja_runtime.worker.runner import Runner
from abeja_runtime.worker.warmup import Warmup, WarmupFailed

__all__ = ["main"]

_log = logging.getLogger("abeja_runtime")
#: prctl(PR_SET_PDEATHSIG): the kernel kills this process when the front dies, whatever the
#: handler is doing (a socket closed by a dead front is only noticed between calls).
_PR_SET_PDEATHSIG: Final = 1


def main() -> None:
    """Process entry point; ``os._exit`` at the end, so that a handler thread cannot hold it."""
    fd, front = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(fd, False)  # the handler's own subprocesses do not get it
    for signum in _STOP_SIGNALS:  # the front decides when to stop (see _default_stop_signals)
        signal.signal(signum, _do_nothing)
    os.register_at_fork(after_in_child=_default_stop_signals)
    with contextlib.suppress(OSError, AttributeError):  # killed by the kernel when the front dies
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != front:  # the front died before the line above
        os._exit(1)
    run_as_batch()
    cancellations = Cancellations()
    credits = StreamCredits(cancellations)

    def cancelled(call_id: int) -> None:
        cancellations.cancel(call_id)
        credits.stop_waiting(call_id)

    channel = BlockingChannel(socket.socket(fileno=fd), _channel_broken, cancelled, credits.grant)
    first = channel.read()
    start = first[0] if first is not None else None
    if not isinstance(start, Start) or start.version != VERSION:
        os._exit(2)  # not started by a front of this version
    config = start.config
    configure_logging(config.log_level, config.platform.log_fields(), log_format=config.log_format)
    capture_prints()
    limit_image_pixels(config.max_image_pixels)
    # Before the handler is imported: its own tracer provider is this one.
    tracing = tracing_from(os.environ, "worker")
    try:
        code = _serve(config, channel, cancellations, credits, tracing)
    except Exception:
        _log.exception("the worker failed")
        code = 1
    if tracing is not None:
        tracing.shutdown()  # its spans still buffered go out
    logging.shutdown()
    os._exit(code)


def _channel_broken(exc: ProtocolError) -> NoReturn:
    """What arrives from the front cannot be read any more (most often: the handler used up the
    process's open files, so a body's descriptor could not be received): said in the log, the
    process ends; the front answers its calls 502 and starts a fresh process."""
    _log.error("the worker stops: %s", exc)
    logging.shutdown()
    os._exit(_EXIT_CHANNEL_BROKEN)


#: The exit code of a worker whose channel broke (EX_PROTOCOL of sysexits.h).
_EXIT_CHANNEL_BROKEN: Final = 76
#: SIGTERM and SIGINT (a Ctrl-C reaches the whole process group) do nothing here: the front
#: drains, then closes this process's socket.
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


def _do_nothing(signum: int, frame: object) -> None:
    """A handler rather than ``SIG_IGN``, which the handler's own subprocesses would inherit
    through fork and exec; exec resets a handler to the default."""


def _default_stop_signals() -> None:
    """In a child forked from Python (multiprocessing's), the stop signals as usual."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt


def _serve(
    config: Config,
    channel: BlockingChannel,
    cancellations: Cancellations,
    credits: StreamCredits,
    tracing: Tracing | None,
) -> int:
    loading = time.monotonic()
    try:
        handler = load_handler(config)
        batch = declared_batch(handler.func) if config.max_batch_size == 1 else None
        if batch is not None:  # @abeja_runtime.batched, the settings silent
            config = dataclasses.replace(config, max_batch_size=batch[0], max_batch_wait=batch[1])
        if config.max_batch_size > 1 and handler.style != "abeja":
            raise HandlerLoadError(
                f"--max-batch-size (ABEJA_RUNTIME_MAX_BATCH_SIZE) batches requests for a "
                f"handler(requests, context) function of the abeja style; {handler.name} is "
                f"served with the {handler.style} style, which takes one request a call: "
                "leave --max-batch-size at 1"
            )
    except Exception as exc:
        details = "" if isinstance(exc, HandlerLoadError) else traceback.format_exc()
        if isinstance(exc, HandlerLoadError) and exc.__cause__ is not None:
            details = user_traceback(exc.__cause__)
        channel.write(LoadFailed(str(exc), details))
        return 1
    rpc_methods = handler.rpc.methods if handler.rpc is not None else ()
    ready = Ready(VERSION, handler.style, handler.front_paths, rpc_methods, batch)
    invoker = Invoker(config, handler, tracing)
    runner = Runner(config, invoker, channel, cancellations, credits, tracing)
    warmup = Warmup(config, invoker, channel, ready, time.monotonic() - loading)
    code = 0
    try:
        _executor(handler, config, runner).serve(warmup)
    except WarmupFailed as exc:
        _log.error("%s", exc)
        code = EXIT_WARMUP_FAILED
    if handler.stop is not None:  # the style's teardown after the last call
        try:
            finish(settled(handler.stop()))
        except Exception:
            _log.exception("stopping the handler %s failed", handler.name)
    return code


def _executor(handler: LoadedHandler, config: Config, runner: Runner) -> Executor:
    """Where the calls run, chosen once: an ``async def`` handler's (or an async gRPC
    service's) on the event loop; a ``def`` handler's on the main thread, or on threads."""
    if handler.is_async or (handler.rpc is not None and handler.rpc.is_async):
        from abeja_runtime.worker.event_loop import EventLoop  # asyncio only then

        return EventLoop(runner, config.concurrency, config.event_loop)
    if config.concurrency == 1:
        return MainThread(runner)
    return Threads(runner, config.concurrency)
