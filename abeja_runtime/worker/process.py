"""A handler process (``python -m abeja_runtime.worker FD FRONT_PID``), started by the front
(``front/processes.py``) with its end of a socket pair (``frames.py``), or forked from the
template that loaded the handler (``template.py``): it loads the handler (``loader.py``) unless
the template did, warms it up (``warmup.py``) where its calls will run, says
:class:`~abeja_runtime.frames.Ready`, and runs the calls (``runner.py``) where the executor
chosen at start runs them: on the main thread (:class:`MainThread`), on N threads
(:class:`Threads`), or on the event loop (``event_loop.py``).

Every decision about this process's life is the front's: SIGTERM and SIGINT are ignored, and the
front closing the socket means "stop": the handler's teardown runs, and the process exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Final, NoReturn

from abeja_runtime.batched import declared_batch
from abeja_runtime.config import Config
from abeja_runtime.encode import word_errors_for
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
from abeja_runtime.worker.invoke import Invoker, finish, settled
from abeja_runtime.worker.loader import load_handler
from abeja_runtime.worker.runner import Held, Runner
from abeja_runtime.worker.warmup import Warmup, WarmupFailed

if TYPE_CHECKING:
    from abeja_runtime.worker.event_loop import EventLoop

__all__ = [
    "WORKER_NAME",
    "ImportedHandler",
    "WorkerChannel",
    "end",
    "load",
    "main",
    "name_this_process",
    "obey",
    "serve",
    "start",
    "start_frame",
]

_log = logging.getLogger("abeja_runtime")
#: prctl(PR_SET_PDEATHSIG): the kernel kills this process when the front dies, whatever the
#: handler is doing (a socket closed by a dead front is only noticed between calls).
_PR_SET_PDEATHSIG: Final = 1


def start() -> tuple[WorkerChannel, Start, int]:
    """This process's channel with the front (its descriptor and the front's pid on its command
    line), the front's first frame, and the front's pid; the process set up as the settings
    say (its logs, its ``print``, its image limit), obeying the front, as a batch process."""
    fd, front = int(sys.argv[1]), int(sys.argv[2])
    os.set_inheritable(fd, False)  # the handler's own subprocesses do not get it
    os.register_at_fork(after_in_child=_default_stop_signals)
    obey(front)
    run_as_batch()
    worker = WorkerChannel(socket.socket(fileno=fd))
    first = start_frame(worker.channel)
    config = first.config
    configure_logging(config.log_level, config.platform.log_fields(), log_format=config.log_format)
    capture_prints()
    limit_image_pixels(config.max_image_pixels)
    return worker, first, front


def main(worker: WorkerChannel, config: Config) -> NoReturn:
    """A handler process from its settings to its exit (``os._exit``, so that a handler thread
    cannot hold it)."""
    name_this_process(WORKER_NAME)
    # Before the handler is imported: its own tracer provider is this one.
    tracing = tracing_from(os.environ, "worker")
    try:
        code = serve(load(config), worker, tracing)
    except Exception:
        _log.exception("the worker failed")
        code = 1
    end(code, tracing)


#: What ``ps -o comm``, ``top`` and ``/proc/PID/comm`` call a handler process.
WORKER_NAME: Final = b"abeja-worker"
_PR_SET_NAME: Final = 15


def name_this_process(name: bytes) -> None:
    """The name ``ps -o comm`` shows for this process (prctl PR_SET_NAME)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, name)


def obey(front: int) -> None:
    """Every decision about this process's life is the front's: the stop signals do nothing
    (:data:`_STOP_SIGNALS`), and the kernel kills it when the front dies."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _do_nothing)
    with contextlib.suppress(OSError, AttributeError):  # killed by the kernel when the front dies
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != front:  # the front died before the line above
        os._exit(1)


class WorkerChannel:
    """A handler process's channel to the front, with what it says of the calls as it reads it:
    a cancel stops its call, a credit lets its stream go on."""

    def __init__(self, sock: socket.socket) -> None:
        self.cancellations = Cancellations()
        self.credits = StreamCredits(self.cancellations)
        self.channel = BlockingChannel(sock, _channel_broken, self._cancelled, self.credits.grant)

    def _cancelled(self, call_id: int) -> None:
        self.cancellations.cancel(call_id)
        self.credits.stop_waiting(call_id)


def start_frame(channel: BlockingChannel) -> Start:
    """The front's first frame, its :class:`Start`; the process exits (2) when it is not a
    front of this version's."""
    first = channel.read()
    start = first[0] if first is not None else None
    if not isinstance(start, Start) or start.version != VERSION:
        os._exit(2)
    return start


def end(code: int, tracing: Tracing | None) -> NoReturn:
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
#: drains, then closes this process's socket; SIGHUP (a terminal's hang-up reaches the group)
#: is the front's reload.
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _do_nothing(signum: int, frame: object) -> None:
    """A handler rather than ``SIG_IGN``, which the handler's own subprocesses would inherit
    through fork and exec; exec resets a handler to the default."""


def _default_stop_signals() -> None:
    """In a child forked from Python (multiprocessing's), the stop signals as usual."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt


@dataclasses.dataclass(frozen=True)
class ImportedHandler:
    """The handler, imported and adapted, with the settings it is served by."""

    handler: LoadedHandler
    #: The settings, with the batch size and wait the handler declared.
    config: Config
    #: What it declared itself (``@abeja_runtime.batched``), for :class:`Ready`.
    batch: tuple[int, float] | None
    #: Seconds its import took.
    seconds: float
    #: When this process was forked from the template that imported it (``time.monotonic``);
    #: ``None``: it imported the handler itself.
    forked_at: float | None = None

    def how(self) -> str:
        """How this process came by it, for its log."""
        if self.forked_at is None:
            return f"loaded the handler in {self.seconds:.2f} s"
        return (
            f"was forked from the template in {time.monotonic() - self.forked_at:.3f} s (the "
            f"template loaded the handler in {self.seconds:.2f} s)"
        )


def load(config: Config) -> ImportedHandler | LoadFailed:
    """Import the handler (``loader.py``): what was loaded, or what the front is told of why
    it could not be."""
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
        return LoadFailed(str(exc), details)
    return ImportedHandler(handler, config, batch, time.monotonic() - loading)


def serve(
    loaded: ImportedHandler | LoadFailed, worker: WorkerChannel, tracing: Tracing | None
) -> int:
    """Warm the handler up, say :class:`Ready`, run the calls until the front closes the
    socket, then the style's teardown: the exit code."""
    channel = worker.channel
    if isinstance(loaded, LoadFailed):
        channel.write(loaded)
        return 1
    handler, config = loaded.handler, loaded.config
    word_errors_for(handler.style)
    invoker = Invoker(config, handler, tracing)
    runner = Runner(config, invoker, channel, worker.cancellations, worker.credits, tracing)
    executor = _executor(handler, config, runner)
    ready = Ready(
        VERSION,
        handler.style,
        handler.front_paths,
        handler.rpc.methods if handler.rpc is not None else (),
        loaded.batch,
        loaded.seconds,
        loaded.forked_at is not None,
        writes_streams=runner.clients is not None,  # as the executor chose
    )
    warmup = Warmup(config, invoker, channel, ready, loaded.how())
    code = 0
    try:
        executor.serve(warmup)
    except WarmupFailed as exc:
        _log.error("%s", exc)
        code = EXIT_WARMUP_FAILED
    if handler.stop is not None:  # the style's teardown after the last call
        try:
            finish(settled(handler.stop()))
        except Exception:
            _log.exception("stopping the handler %s failed", handler.name)
    return code


def _executor(
    handler: LoadedHandler, config: Config, runner: Runner
) -> MainThread | Threads | EventLoop:
    """Where the calls run, chosen once: an ``async def`` handler's (or an async gRPC
    service's) on the event loop; a ``def`` handler's on the main thread, or on threads."""
    if handler.is_async or (handler.rpc is not None and handler.rpc.is_async):
        from abeja_runtime.worker.event_loop import EventLoop  # asyncio only then

        return EventLoop(runner, config.concurrency, config.event_loop)
    if config.concurrency == 1:
        return MainThread(runner)
    return Threads(runner, config.concurrency)


#: How often the main thread's watch looks whether its call is slow, and then gives back the
#: calls the front takes back (the front asks for them 50 ms into a call).
_SLOW_CALL_LOOK: Final = 0.02


class MainThread:
    """A ``def`` handler at ``--concurrency 1``: each call on the main thread, the one that
    imported the handler, which reads the next frame only once the call is answered (a crash
    loses only the call that ran: the calls sent and not started are still the front's)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        runner.credits.wait_reading(runner.channel, runner.give_back)
        self._calls_started = 0
        self._in_call = False

    def serve(self, warmup: Warmup) -> None:
        finish(self._serve(warmup))

    async def _serve(self, warmup: Warmup) -> None:
        await warmup.run()
        runner = self._runner
        stopped = threading.Event()
        threading.Thread(
            target=self._watch, args=(stopped,), name="abeja-slow-call-watch", daemon=True
        ).start()
        for calls in runner.calls():
            self._calls_started += 1
            self._in_call = True
            await runner.run(calls)
            self._in_call = False
        stopped.set()

    def _watch(self, stopped: threading.Event) -> None:
        """While a call runs on the main thread, nothing reads the socket: this thread does once
        the call is slow, and gives back the calls behind it that the front takes back. The
        main thread only counts its calls: no lock, clock or system call per call."""
        seen = -1
        while not stopped.wait(_SLOW_CALL_LOOK):
            started = self._calls_started
            if self._in_call and started == seen:  # the same call as a look ago
                for frame, fd in self._runner.channel.taken_back():
                    self._runner.give_back(frame, fd)
            seen = started


class Threads:
    """A ``def`` handler at ``--concurrency N``: ``N`` handler threads, fed in the order the
    calls came, each writing its own answers."""

    def __init__(self, runner: Runner, count: int) -> None:
        self._runner = runner
        self._count = count

    def serve(self, warmup: Warmup) -> None:
        finish(warmup.run())
        jobs: queue.SimpleQueue[list[Held] | None] = queue.SimpleQueue()
        pool = [
            threading.Thread(target=finish, args=(self._work(jobs),), name=f"abeja-handler-{i}")
            for i in range(self._count)
        ]
        for thread in pool:
            thread.start()
        for calls in self._runner.calls():
            jobs.put(calls)
        for _ in pool:
            jobs.put(None)
        for thread in pool:
            thread.join()

    async def _work(self, jobs: queue.SimpleQueue[list[Held] | None]) -> None:
        while (calls := jobs.get()) is not None:
            await self._runner.run(calls)
