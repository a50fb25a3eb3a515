"""The front's handler processes, and the one queue in front of them.

Every call (an HTTP request's, a gRPC call's) is a :class:`PendingCall` submitted to the
:class:`HandlerPool`. It goes at once to a ready handler process with a free slot, or waits in
the one queue that all processes take from, so that no call waits behind a slow one while
another process is idle; admission bounds the calls in the pool (``503 service busy`` beyond).
A process has ``concurrency`` slots plus :data:`PIPELINE`: with one more call already in its
socket, a ``def`` handler starts its next call without waiting for the front. While calls are
quick, a call joins a process that is serving rather than wake an idle one; once a process's
call has run :data:`_PIPELINE_WHILE_YOUNGER`, the front takes back the calls waiting behind it.

A process that exits fails only the calls it was running (the first ``concurrency`` of those it
was sent and had not answered, in order: a process takes calls in the order they came); the
others go back to the head of the queue. The pool replaces a process that died (with a
growing back-off while replacements die before they are ready), one whose oldest call is
older than ``timeout + grace`` (it is killed: the call was answered 504 long ago), and, without
failing a call, one that has served ``--max-requests`` or holds more than
``--max-worker-memory``: its replacement starts first, and it stops once that one is ready and
its own calls are answered.

Processes are fresh interpreters (``python -m abeja_runtime.worker FD FRONT_PID``), never
forks: no state of the front is copied into them, and they do not import aiohttp.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from abeja_runtime.config import Config, MiB
from abeja_runtime.errors import HttpError, ServiceBusy, ServiceUnavailable, WorkerCrashed
from abeja_runtime.frames import (
    FDS_PER_WRITE,
    VERSION,
    Answer,
    Call,
    Cancel,
    Chunk,
    End,
    Frame,
    FrameDecoder,
    GiveBack,
    GivenBack,
    LoadFailed,
    ProtocolError,
    Ready,
    RpcAnswer,
    RpcCall,
    Start,
    encode_frame,
    read_buffer,
    read_fd,
    receive,
)
from abeja_runtime.metrics import FrontMetrics, handler_environment

__all__ = ["HandlerPool", "PendingCall"]

_log = logging.getLogger("abeja_runtime")
#: Calls a process may hold beyond its concurrency, waiting in its socket, while its calls are
#: quick (the oldest younger than :data:`_PIPELINE_WHILE_YOUNGER`): it takes the next one
#: without waiting for the front, and the front hands over a loop iteration's requests at once.
PIPELINE: Final = 16
_PIPELINE_WHILE_YOUNGER: Final = 0.05
#: Calls are quick while a process is busy for less than this per call, on average
#: (:attr:`HandlerPool.call_seconds`). Quick calls go to a process that is already serving
#: rather than wake an idle one: waking a process costs more than the call, and on two cores
#: small JSON requests ran 10 % faster (2 workers; p99 1.3 → 0.8 ms).
_QUICK_CALL: Final = 0.0002
#: ... but only while that process's oldest call is younger than this: a call that turns out
#: slow holds up what joined it in its first milliseconds only.
_JOIN_WHILE_YOUNGER: Final = 0.002
#: The weight of the last call in the running mean of :attr:`HandlerPool.call_seconds`.
_CALL_SECONDS_WEIGHT: Final = 0.1
_TICK: Final = 0.25
#: Back-off before the next replacement while replacements keep dying before they are ready.
_MAX_BACKOFF: Final = 30.0
_SPAWN_RETRY: Final = 1.0
#: A streamed answer may run this many chunks ahead of its client before the front stops
#: reading from the process that produces it.
_STREAM_AHEAD: Final = 8
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_STREAM_FAILED: Final = object()


class PendingCall:
    """One call on its way: the frame to send, its answer when it comes, its streamed chunks."""

    __slots__ = (
        "_cleanup", "abandoned", "answer", "chunks", "fd", "frame", "giving_back", "process",
        "sent_at",
    )  # fmt: skip

    def __init__(
        self,
        frame: Call | RpcCall,
        loop: asyncio.AbstractEventLoop,
        fd: int | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.frame = frame
        self.fd = fd  # sent with the frame (the spool file)
        #: Runs once the call is over (answered, failed, withdrawn): the spool file goes.
        self._cleanup = cleanup
        # The loop is passed, not looked up: on Python 3.11 each lookup is a getpid() call.
        self.answer: asyncio.Future[Answer | RpcAnswer] = loop.create_future()
        self.chunks: asyncio.Queue[Any] | None = None
        self.abandoned = False
        self.process: _Process | None = None
        self.sent_at = 0.0
        #: Its process was asked to give it back (it waits there behind a slow call).
        self.giving_back = False

    async def stream(self) -> Any:
        """The streamed body's chunks as they come (an async iterator); raises
        ``RuntimeError`` where the handler's generator failed or its process died."""
        chunks = self.chunks
        assert chunks is not None
        while (item := await chunks.get()) is not None:
            if item is _STREAM_FAILED:
                raise RuntimeError("the streamed answer was cut short")
            process = self.process
            if process is not None and chunks.qsize() < 2:
                process.resume()
            yield item

    def finish(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def abandon(self) -> None:
        """Nobody waits for the answer any more (timeout, client gone): drop it when it comes."""
        self.abandoned = True
        self.answer.add_done_callback(_retrieve)
        if self.process is not None:
            self.process.resume()


class _Process:
    """One handler process: its socket, the calls it was sent, its state."""

    def __init__(self, config: Config, environment: dict[str, str], pool: HandlerPool) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "abeja_runtime.worker",
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(theirs.fileno(),),
                env=environment,
            )
        self.pid = self.popen.pid
        self._pool = pool
        self._sock = ours
        ours.setblocking(False)
        self._decoder = FrameDecoder()
        self._into = read_buffer()
        #: Frames of this loop iteration, not written yet, and the descriptors they carry.
        self._batch: list[bytes] = []
        self._batch_fds: list[int] = []
        #: What the socket did not take yet.
        self._out: deque[tuple[memoryview, tuple[int, ...]]] = deque()
        self.loop = asyncio.get_running_loop()
        self.state = "starting"  # → ready → stopping
        #: Calls sent and not answered, in the order they were sent.
        self.sent: dict[int, PendingCall] = {}
        self.answered = 0
        #: When its last answer came: its next call was busy from then or from when it was
        #: sent, whichever is later.
        self.answered_at = 0.0
        #: When to look whether calls wait behind a slow one here (see ``HandlerPool``).
        self.take_back_timer: asyncio.TimerHandle | None = None
        self.request_limit: int | None = None
        self.retiring = False
        self.replaces: _Process | None = None
        self._reading = True
        self.exit_fd = _pidfd(self.pid)
        self.loop.add_reader(ours.fileno(), self.read_available)
        self.send(Start(VERSION, config))

    # -- the socket ---------------------------------------------------------------------------

    def send(self, frame: Frame, fd: int | None = None) -> None:
        """Queue ``frame`` (and a duplicate of ``fd``): the frames of one loop iteration go out
        in one write, and the worker reads them in one."""
        if not self._batch:
            self.loop.call_soon(self._flush)
        elif fd is not None and len(self._batch_fds) == FDS_PER_WRITE:
            self._seal()  # what one write may carry
        self._batch.append(encode_frame(frame, has_fd=fd is not None))
        if fd is not None:
            self._batch_fds.append(os.dup(fd))  # the caller may close its own meanwhile

    def _seal(self) -> None:
        """The batch so far becomes one write."""
        self._out.append((memoryview(b"".join(self._batch)), tuple(self._batch_fds)))
        self._batch.clear()
        self._batch_fds.clear()

    def _flush(self) -> None:
        if self._batch:
            self._seal()
        if self._sock.fileno() < 0:  # gone meanwhile
            self._drop_output()
            return
        self._writable()
        if self._out:
            self.loop.add_writer(self._sock.fileno(), self._writable)

    def _writable(self) -> None:
        while self._out:
            data, fds = self._out[0]
            try:
                if fds:
                    rights = array.array("i", fds).tobytes()
                    sent = self._sock.sendmsg(
                        [data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)]
                    )
                else:
                    sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the process is gone; its exit is handled on its own
                self._drop_output()
                break
            _close_all(fds)  # the kernel holds its own copies now
            if sent < len(data):
                self._out[0] = (data[sent:], ())
                return
            self._out.popleft()
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_writer(self._sock.fileno())

    def _drop_output(self) -> None:
        for _, fds in self._out:
            _close_all(fds)
        self._out.clear()

    def read_available(self) -> None:
        """Every frame the socket holds now (also what a process wrote just before it exited)."""
        while True:
            try:
                data, fds = receive(self._sock, self._into)
                frames = self._decoder.feed(data, fds)
            except (BlockingIOError, InterruptedError):
                return
            except ProtocolError as exc:
                self._pool.broken(self, exc)
                return
            except OSError:
                data, frames = self._into[:0], []
            if not data:
                self.close_socket()
                return
            for frame, fd in frames:
                self._pool.received(self, frame, fd)
            if len(data) < len(self._into):  # all there was: no read that says "nothing more"
                return

    def pause(self) -> None:
        if self._reading and self._sock.fileno() >= 0:
            self._reading = False
            self.loop.remove_reader(self._sock.fileno())

    def resume(self) -> None:
        if not self._reading and self._sock.fileno() >= 0:
            self._reading = True
            self.loop.add_reader(self._sock.fileno(), self.read_available)

    def close_socket(self) -> None:
        """Tells the process to finish (it reads the end of its input), or forgets a dead one."""
        if self._sock.fileno() < 0:
            return
        if self._reading:
            self.loop.remove_reader(self._sock.fileno())
        if self._out:
            self.loop.remove_writer(self._sock.fileno())
        self._drop_output()
        self._sock.close()
        self._decoder.close()

    # -- the process --------------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def oldest_call_age(self, now: float) -> float | None:
        for pending in self.sent.values():
            return now - pending.sent_at
        return None


class HandlerPool:
    """``config.workers`` handler processes behind one queue."""

    def __init__(
        self,
        config: Config,
        metrics_dir: str,
        on_change: Callable[[], None],
        on_load_failed: Callable[[str, str], None],
    ) -> None:
        self._config = config
        self._environment = handler_environment(metrics_dir)
        self._on_change = on_change
        self._on_load_failed = on_load_failed
        self.metrics: FrontMetrics | None = None
        self.processes: list[_Process] = []
        self._ready_count = 0
        self._queue: deque[PendingCall] = deque()
        self._turn = 0  # where the next search for a free process starts
        #: The running mean of how long a process is busy with a call (from when the call was
        #: sent, or its previous answer came, to its answer), as the front sees it.
        self.call_seconds = 1.0
        #: Calls admitted and not finished (queued, sent, or running past their deadline).
        self.admitted = 0
        self._capacity = config.workers * (config.concurrency + config.max_queue)
        self._ids = itertools.count(1)
        self.ever_ready = False
        self.stopping = False
        self._deaths_before_ready = 0
        self._respawns: set[asyncio.TimerHandle] = set()
        self._ticker: asyncio.Task[None] | None = None
        self.all_gone = asyncio.Event()
        #: What the first ready process said about its style.
        self.style = ""
        self.front_paths: tuple[str, ...] = ()
        self.rpc_methods: tuple[str, ...] = ()

    def start(self) -> None:
        for _ in range(self._config.workers):
            self._ensure_spawn()
        self._ticker = asyncio.create_task(self._watch())

    @property
    def serving(self) -> bool:
        """A ready process takes calls (asked for every request: a count, not a search). This
        is readiness; :attr:`admitting` is whether a new call is taken."""
        return self._ready_count > 0 and not self.stopping

    @property
    def admitting(self) -> bool:
        """A new call is taken: a process is ready, or the pool was ready and is replacing a
        process that died (its calls wait in the queue for the replacement, bounded by the
        queue and the deadline, as the calls queued before the crash do). Not while
        replacements keep dying before they are ready (:func:`_backoff`): that pool cannot
        start a worker, and says ``503`` at once."""
        if self.stopping:
            return False
        if self._ready_count > 0:
            return True
        return self._replacing()

    def _replacing(self) -> bool:
        """A replacement is loading, and the one before it (if any) did not die loading too."""
        return (
            self.ever_ready
            and _backoff(self._deaths_before_ready) == 0.0
            and any(process.state == "starting" for process in self.processes)
        )

    def _set_state(self, process: _Process, state: str) -> None:
        """Counted while in the pool: one that exited left the count already (``_exited``)."""
        counted = process in self.processes
        if counted and process.state == "ready":
            self._ready_count -= 1
        process.state = state
        if counted and state == "ready":
            self._ready_count += 1

    def next_id(self) -> int:
        return next(self._ids)

    # -- calls --------------------------------------------------------------------------------

    def submit(self, pending: PendingCall) -> None:
        """Send ``pending`` to a free slot, or queue it; ``ServiceBusy`` when the pool is full."""
        if self.admitted >= self._capacity:
            raise ServiceBusy()
        self.admitted += 1
        process = self._free_process()
        if process is None:
            self._queue.append(pending)
        else:
            self._send(process, pending)

    def free_places(self) -> int:
        """Calls that may still be admitted before the queue is full."""
        return self._capacity - self.admitted

    def withdraw(self, pending: PendingCall) -> None:
        """The caller gave up (deadline, client gone): a queued call never runs; a sent one's
        answer is dropped when it comes."""
        pending.abandon()
        if pending.process is not None:
            pending.process.send(Cancel(pending.frame.id))
        else:
            with contextlib.suppress(ValueError):
                self._queue.remove(pending)
                self.admitted -= 1
                pending.finish()

    def _free_process(self) -> _Process | None:
        """Where the next call goes.

        While calls are quick, a process that is serving and whose oldest call is young takes
        it, up to its pipeline (see :data:`_QUICK_CALL`). Otherwise the ready process with the
        fewest calls (ties go round the processes, so that each keeps serving and stays warm)
        when it has a free slot; else, pipelined, one whose calls are quick. A call never waits
        in a process behind a slow one: it waits in the queue, for whichever process frees a
        slot first."""
        processes = self.processes
        most_held = self._config.concurrency + PIPELINE
        if self.call_seconds < _QUICK_CALL:
            now = time.monotonic()
            for process in processes:
                if process.state == "ready" and 0 < len(process.sent) < most_held:
                    age = process.oldest_call_age(now)
                    if age is not None and age < _JOIN_WHILE_YOUNGER:
                        return process
        count = len(processes)
        best: _Process | None = None
        start = self._turn
        for offset in range(count):
            process = processes[(start + offset) % count]
            if process.state == "ready" and (best is None or len(process.sent) < len(best.sent)):
                best = process
                if not process.sent:
                    break
        self._turn = (start + 1) % count if count else 0
        if best is None:
            return None
        held = len(best.sent)
        concurrency = self._config.concurrency
        if held < concurrency:
            return best
        if held < most_held:
            age = best.oldest_call_age(time.monotonic())
            if age is not None and age < _PIPELINE_WHILE_YOUNGER:
                return best
        return None

    def _send(self, process: _Process, pending: PendingCall) -> None:
        pending.process = process
        pending.sent_at = time.monotonic()
        pending.giving_back = False
        process.sent[pending.frame.id] = pending
        process.send(pending.frame, pending.fd)
        if len(process.sent) > self._config.concurrency and process.take_back_timer is None:
            self._look_for_slow_call(process)

    def _look_for_slow_call(self, process: _Process) -> None:
        """Calls wait in ``process`` behind the ones it runs: once its oldest call is
        :data:`_PIPELINE_WHILE_YOUNGER` old, it is slow, and the calls behind it are taken
        back (:class:`GiveBack`) for the queue, where any process that frees a slot takes them.
        Looked at again while calls wait there."""
        process.take_back_timer = None
        calls = list(process.sent.values())
        concurrency = self._config.concurrency
        if len(calls) <= concurrency or self.stopping or process.state != "ready":
            return
        age = time.monotonic() - calls[0].sent_at
        if age < _PIPELINE_WHILE_YOUNGER:
            process.take_back_timer = process.loop.call_later(
                _PIPELINE_WHILE_YOUNGER - age, self._look_for_slow_call, process
            )
            return
        for pending in calls[concurrency:]:
            if not pending.giving_back and not pending.abandoned:
                pending.giving_back = True
                process.send(GiveBack(pending.frame.id))

    def _given_back(self, process: _Process, call_id: int) -> None:
        """``process`` did not run the call: to the queue, in the order the calls came (or
        gone, if nobody waits for it any more)."""
        pending = process.sent.pop(call_id, None)
        if pending is None:
            return
        pending.process = None
        if pending.abandoned:
            self.admitted -= 1
            pending.finish()
        else:
            queue = self._queue
            index = 0
            while index < len(queue) and queue[index].frame.id < call_id:
                index += 1
            queue.insert(index, pending)
        if process.state == "stopping" and not process.sent:
            process.close_socket()
        self._dispatch()

    def _dispatch(self) -> None:
        while self._queue:
            process = self._free_process()
            if process is None:
                return
            self._send(process, self._queue.popleft())

    @property
    def queued(self) -> int:
        """Calls admitted and not running (in the queue, or in a process's socket behind the
        calls it runs), for the queued gauge."""
        concurrency = self._config.concurrency
        running = sum(min(len(process.sent), concurrency) for process in self.processes)
        return max(0, self.admitted - running)

    def received(self, process: _Process, frame: Frame, fd: int | None) -> None:
        """A frame from ``process``."""
        if isinstance(frame, Answer | RpcAnswer):
            pending = process.sent.get(frame.id)
            if pending is None or pending.abandoned or pending.answer.done():
                if fd is not None:
                    os.close(fd)
                if pending is not None and not (isinstance(frame, Answer) and frame.streamed):
                    self._finished(process, pending)
                elif pending is not None:
                    pending.chunks = None  # chunks until End are dropped
                return
            if isinstance(frame, Answer) and frame.streamed:
                pending.chunks = asyncio.Queue()
                pending.answer.set_result(frame)
                return
            if fd is not None and isinstance(frame, Answer):  # its body came as a memfd
                frame = frame._replace(body=read_fd(fd))
            pending.answer.set_result(frame)
            self._finished(process, pending)
        elif isinstance(frame, Chunk):
            pending = process.sent.get(frame.id)
            if pending is not None and pending.chunks is not None and not pending.abandoned:
                pending.chunks.put_nowait(frame.data)
                if pending.chunks.qsize() >= _STREAM_AHEAD:
                    process.pause()
        elif isinstance(frame, End):
            pending = process.sent.get(frame.id)
            if pending is not None:
                if pending.chunks is not None:
                    pending.chunks.put_nowait(_STREAM_FAILED if frame.failed else None)
                self._finished(process, pending)
        elif isinstance(frame, GivenBack):
            self._given_back(process, frame.id)
        elif isinstance(frame, Ready):
            self._ready(process, frame)
        elif isinstance(frame, LoadFailed):
            if self.ever_ready:
                _log.error("worker %s could not load the handler: %s", process.pid, frame.text)
            else:
                self._load_failed(frame.text, frame.details)

    def broken(self, process: _Process, exc: ProtocolError) -> None:
        """``process`` sent what is not a frame: nothing more it sends can be trusted. It is
        killed at once; its exit fails the calls it was running (502) and starts a
        replacement."""
        _log.error(
            "worker %s broke the protocol between it and the front (%s); a handler that writes "
            "to a descriptor it did not open does this. The worker is killed and replaced",
            process.pid,
            exc,
        )
        process.close_socket()
        process.kill()

    def _load_failed(self, text: str, details: str) -> None:
        """The first start failed: the service stops, as on ABEJA Platform (reported once)."""
        if not self.stopping:
            self.stopping = True
            self._on_load_failed(text, details)

    def _finished(self, process: _Process, pending: PendingCall) -> None:
        del process.sent[pending.frame.id]
        now = time.monotonic()
        busy = now - max(pending.sent_at, process.answered_at)
        process.answered_at = now
        self.call_seconds += _CALL_SECONDS_WEIGHT * (busy - self.call_seconds)
        pending.finish()
        self.admitted -= 1
        process.answered += 1
        if process.answered == process.request_limit:
            self._retire(process, "max_requests", f"it has served {process.answered} requests")
        if process.state == "stopping" and not process.sent:
            process.close_socket()
        self._dispatch()

    def _ready(self, process: _Process, ready: Ready) -> None:
        if process.state != "starting":
            return
        self._set_state(process, "ready")
        if not self.ever_ready:  # every worker loads the same handler: the first one says
            self.style = ready.style
            self.front_paths = ready.front_paths
            self.rpc_methods = ready.rpc_methods
        self.ever_ready = True
        self._deaths_before_ready = 0
        if self._config.max_requests:  # a little more for some, so that processes retire apart
            limit = self._config.max_requests
            process.request_limit = limit + random.randint(0, limit // 10)
        _log.info("worker %s is ready", process.pid)
        retired, process.replaces = process.replaces, None
        if retired is not None and retired.state == "ready":
            self._stop(retired)
        self._dispatch()
        self._on_change()

    # -- process lifecycle --------------------------------------------------------------------

    def _ensure_spawn(self) -> None:
        if self._spawn() is None:
            self._spawn_later(_SPAWN_RETRY)

    def _spawn_later(self, delay: float) -> None:
        handle: asyncio.TimerHandle

        def spawn() -> None:
            self._respawns.discard(handle)
            if not self.stopping:
                self._ensure_spawn()

        handle = asyncio.get_running_loop().call_later(delay, spawn)
        self._respawns.add(handle)

    def _spawn(self) -> _Process | None:
        try:
            process = _Process(self._config, self._environment, self)
        except OSError as exc:
            _log.error("cannot start a worker process: %s", exc)
            return None
        self.processes.append(process)
        if process.exit_fd is not None:
            asyncio.get_running_loop().add_reader(process.exit_fd, self._exited, process)
        _log.debug("started worker %s", process.pid)
        return process

    def _stop(self, process: _Process) -> None:
        """No more calls for ``process``; it finishes once the ones it has are answered."""
        self._set_state(process, "stopping")
        if not process.sent:
            process.close_socket()
        self._on_change()

    def _retire(self, process: _Process, reason: str, why: str) -> None:
        """Replace a process that reached a limit without failing a call."""
        if process.retiring or process.state != "ready" or self.stopping:
            return
        replacement = self._spawn()
        if replacement is None:
            return
        process.retiring = True
        replacement.replaces = process
        _log.info("replacing worker %s: %s", process.pid, why)
        self._count_restart(reason)
        self._dispatch()

    def _count_restart(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.worker_restarted(reason)

    def _exited(self, process: _Process) -> None:
        if process.exit_fd is not None:
            asyncio.get_running_loop().remove_reader(process.exit_fd)
            os.close(process.exit_fd)
            process.exit_fd = None
        code = process.popen.wait()
        with contextlib.suppress(
            OSError
        ):  # frames it wrote before it exited (an answer, load_failed)
            process.read_available()
        process.close_socket()
        self.processes.remove(process)
        if process.state == "ready":
            self._ready_count -= 1
        if self.metrics is not None:
            self.metrics.worker_gone(process.pid)
        if process.replaces is not None:  # died before it was ready: the retiree may try again
            process.replaces.retiring = False
        how = _describe_exit(code)
        self._fail_or_requeue(process, how)
        if self.stopping:
            if not self.processes:
                self.all_gone.set()
            self._on_change()
            return
        if process.state == "starting" and not self.ever_ready:
            self._load_failed(f"the worker exited ({how}) while loading the handler", "")
            return
        if process.state == "stopping" and process.popen.returncode == 0:
            pass  # retired or recycled: its replacement exists already
        elif process.state == "stopping":
            pass  # killed as stuck: replaced when it was recycled
        elif process.retiring:
            _log.error(
                "worker %s exited unexpectedly (%s); its replacement is starting already",
                process.pid,
                how,
            )
            self._count_restart("crashed")
        else:
            self._replace(process, how)
        if not self.admitting:  # no process will take the queued calls soon
            self._fail_queue(
                ServiceUnavailable(
                    "service unavailable: the handler's worker processes keep exiting while "
                    "they load; the log says why"
                )
            )
        self._dispatch()
        self._on_change()

    def _fail_queue(self, exc: HttpError) -> None:
        queue, self._queue = self._queue, deque()
        for pending in queue:
            self.admitted -= 1
            pending.finish()
            if not pending.answer.done():
                pending.answer.set_exception(exc)

    def _fail_or_requeue(self, process: _Process, how: str) -> None:
        """The calls that were running fail; the ones that had not started go to the queue."""
        running = self._config.concurrency
        requeue: list[PendingCall] = []
        for index, pending in enumerate(process.sent.values()):
            if index < running or pending.answer.done() or pending.abandoned:
                self.admitted -= 1
                pending.finish()
                if not pending.answer.done():
                    pending.answer.set_exception(WorkerCrashed(how))
                elif pending.chunks is not None:
                    pending.chunks.put_nowait(_STREAM_FAILED)
            else:
                pending.process = None
                requeue.append(pending)
        process.sent.clear()
        self._queue.extendleft(reversed(requeue))

    def _replace(self, process: _Process, how: str) -> None:
        if process.state == "starting":
            self._deaths_before_ready += 1
        delay = _backoff(self._deaths_before_ready)
        when = f" in {delay:g} s (replacements keep dying before they are ready)" if delay else ""
        _log.error(
            "worker %s exited unexpectedly (%s); starting a replacement%s", process.pid, how, when
        )
        self._count_restart("crashed")
        if delay:
            self._spawn_later(delay)
        else:
            self._ensure_spawn()

    async def _watch(self) -> None:
        """Judge calls that outlive timeout + grace, memory limits, and exits without pidfd."""
        limit = self._config.stuck_after
        while True:
            await asyncio.sleep(_TICK)
            now = time.monotonic()
            for process in list(self.processes):
                if process.exit_fd is None and process.popen.poll() is not None:
                    self._exited(process)
                    continue
                if process.state != "ready":
                    continue
                age = process.oldest_call_age(now)
                if limit is not None and age is not None and age > limit:
                    self._recycle_stuck(process)
                else:
                    self._check_memory(process)

    def _recycle_stuck(self, process: _Process) -> None:
        config = self._config
        _log.error(
            "a handler call in worker %s has been running for more than %g s (timeout %g s + "
            "grace %g s); this worker is killed and replaced",
            process.pid,
            config.stuck_after,
            config.timeout,
            config.grace_period,
        )
        _log.warning("recycling worker %s, whose handler is stuck", process.pid)
        self._set_state(process, "stopping")
        process.kill()
        self._count_restart("stuck")
        if not self.stopping:
            self._ensure_spawn()

    def _check_memory(self, process: _Process) -> None:
        limit = self._config.max_worker_memory
        if not limit or process.retiring:
            return
        resident = _resident(process.pid)
        if resident is not None and resident > limit:
            self._retire(
                process,
                "memory",
                f"it holds {resident / MiB:.0f} MiB, more than --max-worker-memory "
                f"{limit / MiB:.0f} MiB",
            )

    # -- shutdown -----------------------------------------------------------------------------

    def stop(self) -> None:
        """No new calls; each process finishes once its calls are answered."""
        self.stopping = True
        for handle in self._respawns:
            handle.cancel()
        self._respawns.clear()
        for process in self.processes:
            self._set_state(process, "stopping")
            if not process.sent:
                process.close_socket()
        if not self.processes:
            self.all_gone.set()

    def kill_all(self) -> None:
        for process in self.processes:
            process.kill()

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        self.kill_all()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An answer nobody awaits any more (a crash after the client left) is no "never
    retrieved"."""
    if not future.cancelled():
        future.exception()


def _close_all(fds: tuple[int, ...]) -> None:
    for fd in fds:
        os.close(fd)


def _pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def _resident(pid: int) -> int | None:
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
