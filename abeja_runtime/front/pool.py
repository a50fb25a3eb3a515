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

This module is the scheduler (the queue, placement, give-back) and the processes' lifecycle;
a process itself (its start, its socket, its frames) is a :class:`~abeja_runtime.front.
processes.HandlerProcess`, made by the factory the pool is given, so that the scheduler can be
tested with fake processes (``tests/unit/test_pool.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final, get_args

from abeja_runtime.config import Config, MiB
from abeja_runtime.errors import HttpError, ServiceBusy, ServiceUnavailable, WorkerCrashed
from abeja_runtime.frames import (
    EXIT_WARMUP_FAILED,
    Answer,
    Cancel,
    Chunk,
    End,
    Frame,
    GiveBack,
    GivenBack,
    LoadFailed,
    ProtocolError,
    Ready,
    RpcAnswer,
    RunBatch,
    read_fd,
)
from abeja_runtime.front.pending import (
    ANSWER_FILE_ABOVE,
    STREAM_FAILED,
    STREAM_LOST,
    AnswerFile,
    Batch,
    PendingCall,
)
from abeja_runtime.front.processes import (
    HandlerProcess,
    ProcessState,
    describe_exit,
    device_environment,
    resident_memory,
)
from abeja_runtime.metrics import FrontMetrics, handler_environment

__all__ = ["HandlerPool"]

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


class HandlerPool:
    """``config.workers`` handler processes behind one queue."""

    def __init__(
        self,
        config: Config,
        metrics_dir: str,
        on_change: Callable[[], None],
        on_load_failed: Callable[[str, str], None],
        process_factory: Callable[
            [Config, dict[str, str], HandlerPool], HandlerProcess
        ] = HandlerProcess,
    ) -> None:
        self._config = config
        self._process_factory = process_factory
        self._environment = handler_environment(metrics_dir)
        self._on_change = on_change
        self._on_load_failed = on_load_failed
        self.metrics: FrontMetrics | None = None
        self.processes: list[HandlerProcess] = []
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
        #: Batch mode (``--max-batch-size`` above 1): a process runs up to ``concurrency``
        #: batches at once, each one call of the handler (see :meth:`_dispatch_batches`).
        self._batch_size = config.max_batch_size
        self._batch_wait = config.max_batch_wait
        self._batching = config.max_batch_size > 1
        self._batch_timer: asyncio.TimerHandle | None = None
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
            and any(process.state is ProcessState.STARTING for process in self.processes)
        )

    def _set_state(self, process: HandlerProcess, state: ProcessState) -> None:
        """Counted while in the pool: one that exited left the count already (``exited``)."""
        counted = process in self.processes
        if counted and process.state is ProcessState.READY:
            self._ready_count -= 1
        process.state = state
        if counted and state is ProcessState.READY:
            self._ready_count += 1

    def next_id(self) -> int:
        return next(self._ids)

    # -- calls --------------------------------------------------------------------------------

    def submit(self, pending: PendingCall) -> None:
        """Send ``pending`` to a free slot, or queue it; ``ServiceBusy`` when the pool is full."""
        if self.admitted >= self._capacity:
            raise ServiceBusy()
        self.admitted += 1
        pending.queued_at = now = time.monotonic()
        if self._batching:
            self._queue.append(pending)
            self._dispatch_batches()
            return
        process = self._free_process(now)
        if process is None:
            self._queue.append(pending)
        else:
            self._send(process, pending, now)

    def free_places(self) -> int:
        """Calls that may still be admitted before the queue is full."""
        return self._capacity - self.admitted

    def running(self, pending: PendingCall) -> bool:
        """Whether ``pending`` runs in its process now: one of the first ``concurrency`` calls
        it was sent (the others wait in its socket, as in the queue)."""
        process = pending.process
        if process is None:
            return False
        if self._batching:  # a batch is sent to a free slot: it runs
            return True
        for index, call_id in enumerate(process.sent):
            if index >= self._config.concurrency:
                return False
            if call_id == pending.frame.id:
                return True
        return False

    def withdraw(self, pending: PendingCall) -> None:
        """The caller gave up (deadline, client gone): a queued call never runs; a sent one's
        answer is dropped when it comes. Once: a call withdrawn already is left as it is."""
        if pending.abandoned:
            return
        pending.abandon()
        if pending.process is not None:
            pending.process.send(Cancel(pending.frame.id))
        else:
            with contextlib.suppress(ValueError):
                self._queue.remove(pending)
                self.admitted -= 1
                self._started(pending, time.monotonic())  # its wait ends here
                pending.finish()

    def _free_process(self, now: float) -> HandlerProcess | None:
        """Where the next call goes.

        While calls are quick, a process that is serving and whose oldest call is young takes
        it, up to its pipeline (see :data:`_QUICK_CALL`). Otherwise the ready process with the
        fewest calls (ties go round the processes, so that each keeps serving and stays warm)
        when it has a free slot; else, pipelined, one whose calls are quick. A call never waits
        in a process behind a slow one: it waits in the queue, for whichever process frees a
        slot first."""
        if self.call_seconds < _QUICK_CALL:
            serving = self._serving_young(now)
            if serving is not None:
                return serving
        processes = self.processes
        count = len(processes)
        best: HandlerProcess | None = None
        start = self._turn
        for offset in range(count):
            process = processes[(start + offset) % count]
            ready = process.state is ProcessState.READY
            if ready and (best is None or len(process.sent) < len(best.sent)):
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
        if held < concurrency + PIPELINE:
            age = best.oldest_call_age(now)
            if age is not None and age < _PIPELINE_WHILE_YOUNGER:
                return best
        return None

    def _serving_young(self, now: float) -> HandlerProcess | None:
        """A ready process that serves calls, the oldest of them younger than
        :data:`_JOIN_WHILE_YOUNGER`, with room in its pipeline (for a quick call to join)."""
        most_held = self._config.concurrency + PIPELINE
        for process in self.processes:
            if process.state is ProcessState.READY and 0 < len(process.sent) < most_held:
                age = process.oldest_call_age(now)
                if age is not None and age < _JOIN_WHILE_YOUNGER:
                    return process
        return None

    def _send(self, process: HandlerProcess, pending: PendingCall, now: float) -> None:
        pending.process = process
        pending.sent_at = now
        pending.giving_back = False
        process.sent[pending.frame.id] = pending
        # Else it waits there (see _finished).
        if not pending.waited and len(process.sent) <= self._config.concurrency:
            self._started(pending, now)
        process.send(pending.frame, pending.fd)
        if len(process.sent) > self._config.concurrency and process.take_back_timer is None:
            self._look_for_slow_call(process)

    def _started(self, pending: PendingCall, now: float) -> None:
        """``pending``'s handler call starts now, or it is given up in the queue (its
        deadline, its client gone): its wait is observed (the queue-wait histogram, its
        span). Once a call: one given back, or whose process died, is not counted again."""
        if pending.waited:
            return
        pending.waited = True
        if self.metrics is not None:
            self.metrics.queue_waited(now - pending.queued_at)
        if pending.trace is not None:
            pending.trace.queue_wait(now - pending.queued_at)

    def _look_for_slow_call(self, process: HandlerProcess) -> None:
        """Calls wait in ``process`` behind the ones it runs: once its oldest call is
        :data:`_PIPELINE_WHILE_YOUNGER` old, it is slow, and the calls behind it are taken
        back (:class:`GiveBack`) for the queue, where any process that frees a slot takes them.
        Looked at again while calls wait there."""
        process.take_back_timer = None
        calls = list(process.sent.values())
        concurrency = self._config.concurrency
        if len(calls) <= concurrency or self.stopping or process.state is not ProcessState.READY:
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

    def _given_back(self, process: HandlerProcess, call_id: int) -> None:
        """``process`` did not run the call: to the queue, in the order the calls came (or
        gone, if nobody waits for it any more)."""
        pending = process.sent.pop(call_id, None)
        if pending is None:
            return
        if pending.batch is not None:
            _left_batch(process, pending)
        pending.process = None
        if pending.abandoned:
            self.admitted -= 1
            self._started(pending, time.monotonic())  # given up while it waited there
            pending.finish()
        else:
            queue = self._queue
            index = 0
            while index < len(queue) and queue[index].frame.id < call_id:
                index += 1
            queue.insert(index, pending)
        if process.state is ProcessState.STOPPING and not process.sent:
            process.close_socket()
        self._dispatch()

    def _dispatch(self) -> None:
        if self._batching:
            self._dispatch_batches()
            return
        queue = self._queue
        if not queue:
            return
        now = time.monotonic()
        while queue:
            process = self._free_process(now)
            if process is None:
                return
            self._send(process, queue.popleft(), now)

    def _dispatch_batches(self) -> None:
        """Batch mode: the queue's calls go in batches of up to ``--max-batch-size``, each to
        a process's free slot, by Triton's rule rather than a fixed window. A process that runs
        nothing takes what waits at once (a lone request pays no wait); while every process
        runs a batch, calls gather, and a batch goes to a free slot once it is full or its first
        call has waited ``--max-batch-wait`` (a timer from that call's arrival, never moved by
        the calls that join it); with no free slot, they gather until a slot frees."""
        queue = self._queue
        while queue:
            process, reason = self._batch_place()
            if process is None:
                return
            size = min(self._batch_size, len(queue))
            batch = Batch(size)
            now = time.monotonic()
            calls = [queue.popleft() for _ in range(size)]
            for pending in calls:
                pending.batch = batch
                pending.process = process
                self._started(pending, now)
                pending.sent_at = now
                process.sent[pending.frame.id] = pending
                process.send(pending.frame, pending.fd)
            process.send(RunBatch(tuple(pending.frame.id for pending in calls)))
            process.batches += 1
            if self.metrics is not None:
                waits = [now - pending.queued_at for pending in calls]
                self.metrics.batching().released(size, reason, waits)

    def _batch_place(self) -> tuple[HandlerProcess | None, str]:
        """Where the next batch goes now, and why (``full``, ``waited``, ``idle``); no process
        while it is to gather (a timer is set for its first call's wait)."""
        full = len(self._queue) >= self._batch_size
        free: HandlerProcess | None = None
        for process in self.processes:
            if process.state is not ProcessState.READY:
                continue
            if not process.batches:
                return process, "full" if full else "idle"
            if free is None and process.batches < self._config.concurrency:
                free = process
        if free is None:
            return None, ""
        if full:
            return free, "full"
        left = self._queue[0].queued_at + self._batch_wait - time.monotonic()
        if left <= 0:
            return free, "waited"
        if self._batch_timer is None:
            self._batch_timer = free.loop.call_later(left, self._batch_waited)
        return None, ""

    def _batch_waited(self) -> None:
        self._batch_timer = None
        self._dispatch_batches()

    @property
    def queued(self) -> int:
        """Calls admitted and not running (in the queue, or in a process's socket behind the
        calls it runs), for the queued gauge."""
        if self._batching:
            return max(0, self.admitted - sum(len(process.sent) for process in self.processes))
        concurrency = self._config.concurrency
        running = sum(min(len(process.sent), concurrency) for process in self.processes)
        return max(0, self.admitted - running)

    def received(self, process: HandlerProcess, frame: Frame, fd: int | None) -> None:
        """A frame from ``process``, to the receiver of its class (:attr:`_RECEIVERS`)."""
        self._RECEIVERS[type(frame)](self, process, frame, fd)

    def _answer_received(self, process: HandlerProcess, frame: Answer, fd: int | None) -> None:
        pending = process.sent.get(frame.id)
        if pending is None or pending.abandoned or pending.answer.done():
            if fd is not None:
                os.close(fd)
            if pending is None:
                return
            if frame.streamed:
                pending.streaming = True
                pending.chunks = None  # chunks until End are dropped
            else:
                self._finished(process, pending)
            return
        if frame.streamed:
            pending.streaming = True
            pending.chunks = asyncio.Queue()
            pending.answer.set_result(frame)
            return
        if fd is not None:  # its body came as a memfd
            if os.fstat(fd).st_size > ANSWER_FILE_ABOVE:  # written from there
                pending.answer_file = AnswerFile(fd)
            else:
                frame = frame._replace(body=read_fd(fd))
        pending.answer.set_result(frame)
        self._finished(process, pending)

    def _rpc_answer_received(
        self, process: HandlerProcess, frame: RpcAnswer, fd: int | None
    ) -> None:
        pending = process.sent.get(frame.id)
        if pending is None or pending.abandoned or pending.answer.done():
            if fd is not None:
                os.close(fd)
            if pending is not None:
                self._finished(process, pending)
            return
        if fd is not None:  # its message came as a memfd
            frame = frame._replace(payload=read_fd(fd))
        pending.answer.set_result(frame)
        self._finished(process, pending)

    def _chunk_received(self, process: HandlerProcess, frame: Chunk, fd: int | None) -> None:
        pending = process.sent.get(frame.id)
        if pending is not None and pending.chunks is not None and not pending.abandoned:
            pending.chunks.put_nowait(frame.data if fd is None else AnswerFile(fd))
        elif fd is not None:
            os.close(fd)

    def _end_received(self, process: HandlerProcess, frame: End, fd: int | None) -> None:
        pending = process.sent.get(frame.id)
        if pending is not None:
            if pending.chunks is not None:
                pending.chunks.put_nowait(STREAM_FAILED if frame.failed else None)
            self._finished(process, pending)

    def _given_back_received(
        self, process: HandlerProcess, frame: GivenBack, fd: int | None
    ) -> None:
        self._given_back(process, frame.id)

    def _ready_received(self, process: HandlerProcess, frame: Ready, fd: int | None) -> None:
        self._ready(process, frame)

    def _load_failed_received(
        self, process: HandlerProcess, frame: LoadFailed, fd: int | None
    ) -> None:
        if self.ever_ready:
            _log.error("worker %s could not load the handler: %s", process.pid, frame.text)
        else:
            self._load_failed(frame.text, frame.details)

    def _not_for_the_front(self, process: HandlerProcess, frame: Frame, fd: int | None) -> None:
        """A frame the front sends and never receives (a handler process does not send it)."""
        if fd is not None:
            os.close(fd)

    #: The receiver of each frame class, by the frame's exact class: one lookup per frame (an
    #: ``isinstance`` ladder tried the classes in turn; ``match`` with class patterns does
    #: too, and makes a set and a list for each pattern that matches).
    _RECEIVERS: Final[
        dict[type[Any], Callable[[HandlerPool, HandlerProcess, Any, int | None], None]]
    ] = {
        **dict.fromkeys(get_args(Frame), _not_for_the_front),
        Answer: _answer_received,
        RpcAnswer: _rpc_answer_received,
        Chunk: _chunk_received,
        End: _end_received,
        GivenBack: _given_back_received,
        Ready: _ready_received,
        LoadFailed: _load_failed_received,
    }

    def broken(self, process: HandlerProcess, exc: ProtocolError) -> None:
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

    def _finished(self, process: HandlerProcess, pending: PendingCall) -> None:
        del process.sent[pending.frame.id]
        now = time.monotonic()
        if not pending.waited:  # answered, yet taken for waiting (a GiveBack's race): up to now
            self._started(pending, now)
        if pending.batch is not None:
            _left_batch(process, pending)
        elif len(process.sent) >= self._config.concurrency:  # the next one sent there starts
            concurrency = self._config.concurrency
            following = (
                next(iter(process.sent.values()))
                if concurrency == 1
                else next(itertools.islice(process.sent.values(), concurrency - 1, None))
            )
            if not following.waited and not following.giving_back:  # (given back: it waits on)
                self._started(following, now)
        busy = now - max(pending.sent_at, process.answered_at)
        process.answered_at = now
        self.call_seconds += _CALL_SECONDS_WEIGHT * (busy - self.call_seconds)
        pending.finish()
        self.admitted -= 1
        process.answered += 1
        if process.answered == process.request_limit:
            self._retire(process, "max_requests", f"it has served {process.answered} requests")
        if process.state is ProcessState.STOPPING and not process.sent:
            process.close_socket()
        self._dispatch()

    def _ready(self, process: HandlerProcess, ready: Ready) -> None:
        if process.state is not ProcessState.STARTING:
            return
        self._set_state(process, ProcessState.READY)
        if not self.ever_ready:  # every worker loads the same handler: the first one says
            self.style = ready.style
            self.front_paths = ready.front_paths
            self.rpc_methods = ready.rpc_methods
            if ready.batch is not None:  # declared by the handler (@abeja_runtime.batched)
                self._batch_size, self._batch_wait = ready.batch
                self._batching = True
                now = time.monotonic()
                for pending in self._queue:  # queued before the mode was known: from now
                    pending.queued_at = now
                if self.metrics is not None:
                    self.metrics.batching()
        self.ever_ready = True
        self._deaths_before_ready = 0
        if self._config.max_requests:  # a little more for some, so that processes retire apart
            limit = self._config.max_requests
            process.request_limit = limit + random.randint(0, limit // 10)
        _log.info("worker %s is ready", process.pid)
        retired, process.replaces = process.replaces, None
        if retired is not None and retired.state is ProcessState.READY:
            self._stop(retired)
        self._dispatch()
        self._on_change()

    # -- process lifecycle --------------------------------------------------------------------

    def _ensure_spawn(self, retiree: HandlerProcess | None = None) -> None:
        """A new process (as ``retiree``'s replacement, while that one still serves), now or
        after a retry."""
        process = self._spawn()
        if process is None:
            self._spawn_later(_SPAWN_RETRY, retiree)
        elif retiree is not None and retiree in self.processes:
            process.replaces = retiree

    def _spawn_later(self, delay: float, retiree: HandlerProcess | None = None) -> None:
        handle: asyncio.TimerHandle

        def spawn() -> None:
            self._respawns.discard(handle)
            if not self.stopping:
                self._ensure_spawn(retiree)

        handle = asyncio.get_running_loop().call_later(delay, spawn)
        self._respawns.add(handle)

    def _spawn(self) -> HandlerProcess | None:
        environment = device_environment(self._environment, self._config.devices, self.processes)
        try:
            process = self._process_factory(self._config, environment, self)
        except OSError as exc:
            _log.error("cannot start a worker process: %s", exc)
            return None
        self.processes.append(process)
        if process.exit_fd is not None:
            asyncio.get_running_loop().add_reader(process.exit_fd, self.exited, process)
        _log.debug("started worker %s", process.pid)
        return process

    def _stop(self, process: HandlerProcess) -> None:
        """No more calls for ``process``; it finishes once the ones it has are answered."""
        self._set_state(process, ProcessState.STOPPING)
        if not process.sent:
            process.close_socket()
        self._on_change()

    def _retire(self, process: HandlerProcess, reason: str, why: str) -> None:
        """Replace a process that reached a limit without failing a call."""
        if process.retiring or process.state is not ProcessState.READY or self.stopping:
            return
        process.retiring = True  # from before the spawn: its replacement takes its device
        replacement = self._spawn()
        if replacement is None:
            process.retiring = False
            return
        replacement.replaces = process
        _log.info("replacing worker %s: %s", process.pid, why)
        self._count_restart(reason)
        self._dispatch()

    def _count_restart(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.worker_restarted(reason)

    def exited(self, process: HandlerProcess) -> None:
        """``process`` has exited (its pidfd said so, or the watch saw it): its running calls
        fail, the others go back to the queue, and it is replaced if it should be."""
        code = self._forget(process)
        how = describe_exit(code)
        self._fail_or_requeue(process, how)
        if self.stopping:
            if not self.processes:
                self.all_gone.set()
            self._on_change()
            return
        # One that loaded the handler and failed its warm-up is replaced, with back-off.
        warmup_failed = code == EXIT_WARMUP_FAILED
        if process.state is ProcessState.STARTING and not self.ever_ready and not warmup_failed:
            self._load_failed(f"the worker exited ({how}) while loading the handler", "")
            return
        self._replace_exited(process, "after its failed warm-up" if warmup_failed else None, how)
        if not self.admitting:  # no process will take the queued calls soon
            self._fail_queue(
                ServiceUnavailable(
                    "service unavailable: the handler's worker processes keep exiting while "
                    "they load; the log says why"
                )
            )
        self._dispatch()
        self._on_change()

    def _forget(self, process: HandlerProcess) -> int:
        """Take in what an exited process wrote before it exited (an answer, LoadFailed), then
        forget it: its exit code."""
        if process.exit_fd is not None:
            asyncio.get_running_loop().remove_reader(process.exit_fd)
            os.close(process.exit_fd)
            process.exit_fd = None
        code = process.popen.wait()
        with contextlib.suppress(OSError):
            process.read_available()
        process.close_socket()
        self.processes.remove(process)
        if process.state is ProcessState.READY:
            self._ready_count -= 1
        if self.metrics is not None:
            self.metrics.worker_gone(process.pid)
        return code

    def _replace_exited(self, process: HandlerProcess, expected: str | None, how: str) -> None:
        """Start a replacement for a process that exited, unless it has one already.
        ``expected``: why it exited, when it said so itself (its warm-up failed)."""
        if process.state is ProcessState.STOPPING:
            return  # retired, recycled or killed as stuck: its replacement exists already
        retiree = process.replaces
        if retiree is None or retiree not in self.processes:
            retiree = None  # else it died before it was ready: the retiree serves on meanwhile
        if process.state is ProcessState.STARTING:
            self._deaths_before_ready += 1
        delay = 0.0 if process.retiring else _backoff(self._deaths_before_ready)
        if process.retiring:
            when = "; its replacement is starting already"
        elif delay:
            when = f"; starting a replacement in {delay:g} s (replacements keep dying before "
            when += "they are ready)"
        else:
            when = "; starting a replacement"
        if expected is None:
            _log.error("worker %s exited unexpectedly (%s)%s", process.pid, how, when)
        else:
            _log.warning("worker %s exited %s%s", process.pid, expected, when)
        self._count_restart("crashed" if expected is None else "warmup_failed")
        if process.retiring:
            return
        if delay:
            self._spawn_later(delay, retiree)
        else:
            self._ensure_spawn(retiree)

    def _fail_queue(self, exc: HttpError) -> None:
        queue, self._queue = self._queue, deque()
        now = time.monotonic()
        for pending in queue:
            self.admitted -= 1
            self._started(pending, now)  # given up in the queue
            pending.finish()
            if not pending.answer.done():
                pending.answer.set_exception(exc)

    def _fail_or_requeue(self, process: HandlerProcess, how: str) -> None:
        """The calls that were running fail; the ones that had not started go to the queue."""
        # A batch is sent to a free slot: all of a batch process's calls were running.
        running = len(process.sent) if self._batching else self._config.concurrency
        requeue: list[PendingCall] = []
        now = time.monotonic()
        for index, pending in enumerate(process.sent.values()):
            if index < running or pending.answer.done() or pending.abandoned:
                self.admitted -= 1
                self._started(pending, now)  # if it still waited there, its wait ends
                pending.finish()
                if not pending.answer.done():
                    pending.answer.set_exception(WorkerCrashed(how))
                elif pending.chunks is not None:
                    pending.chunks.put_nowait(STREAM_LOST)
            else:
                pending.process = None
                requeue.append(pending)
        process.sent.clear()
        self._queue.extendleft(reversed(requeue))

    async def _watch(self) -> None:
        """Judge stuck handlers (:meth:`_stuck`), memory limits, and exits without pidfd."""
        while True:
            await asyncio.sleep(_TICK)
            now = time.monotonic()
            for process in list(self.processes):
                if process.exit_fd is None and process.popen.poll() is not None:
                    self.exited(process)
                    continue
                if process.state is not ProcessState.READY:
                    continue
                stuck = self._stuck(process, now)
                if stuck is not None:
                    self._recycle_stuck(process, stuck)
                else:
                    self._check_memory(process)

    def _stuck(self, process: HandlerProcess, now: float) -> str | None:
        """What is stuck in ``process``'s handler (``None``: nothing): a call not answered
        ``timeout + grace`` after it was sent (it was answered ``504`` long ago), or a stream
        still running ``grace`` after it was withdrawn (cut, or its client left: its generator
        does not stop). A stream that goes on producing is never stuck, however old: its
        limits end it alone (``stream_limits.py``)."""
        config = self._config
        limit = config.stuck_after
        if limit is None:
            return None
        running = len(process.sent) if self._batching else config.concurrency
        for pending in itertools.islice(process.sent.values(), running):
            if not pending.streaming:
                if now - pending.sent_at > limit:
                    return (
                        f"a handler call in worker {process.pid} has been running for more than "
                        f"{limit:g} s (timeout {config.timeout:g} s + grace "
                        f"{config.grace_period:g} s)"
                    )
            elif pending.withdrawn_at and now - pending.withdrawn_at > config.grace_period:
                return (
                    f"a streamed answer of worker {process.pid} has gone on for more than "
                    f"{config.grace_period:g} s (the grace period) after it was cut, its "
                    "generator not stopping"
                )
        return None

    def _recycle_stuck(self, process: HandlerProcess, stuck: str) -> None:
        _log.error("%s; this worker is killed and replaced", stuck)
        _log.warning("recycling worker %s, whose handler is stuck", process.pid)
        self._set_state(process, ProcessState.STOPPING)
        process.kill()
        self._count_restart("stuck")
        if not self.stopping and not process.retiring:  # a retiree's replacement is coming
            self._ensure_spawn()

    def _check_memory(self, process: HandlerProcess) -> None:
        limit = self._config.max_worker_memory
        if not limit or process.retiring:
            return
        resident = resident_memory(process.pid)
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
            self._set_state(process, ProcessState.STOPPING)
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


def _left_batch(process: HandlerProcess, pending: PendingCall) -> None:
    """``pending`` is out of its batch (answered, given back): the batch's slot in ``process``
    is free once none of its calls is left."""
    assert pending.batch is not None
    pending.batch.left -= 1
    if not pending.batch.left:
        process.batches -= 1
    pending.batch = None


def _backoff(deaths_before_ready: int) -> float:
    if deaths_before_ready <= 1:
        return 0.0
    return float(min(_MAX_BACKOFF, 0.5 * 2 ** (deaths_before_ready - 2)))
