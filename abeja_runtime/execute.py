"""Handler threads: calls run off the event loop, and their results come back in batches.

Sync handlers run on dedicated threads that take jobs from one ``queue.SimpleQueue`` and answer
the event loop with ``call_soon_threadsafe``; contract A1 measured this hand-off as the fastest.
Jobs wait in that queue, not on the loop, so a thread starts the next call the moment it may.

A job is a whole call that returns ``(value, chunks)``. ``chunks`` (an iterator of bytes, or
None) is iterated on the same thread once ``value`` has gone to the loop, a few chunks ahead of
the socket at most. So user code never interleaves with another call, and with one thread every
call runs on the thread that imported the handler module. This module knows nothing of HTTP,
of encoding or of admission: the request lifecycle (``lifecycle.py``) decides what a call is,
how many may wait, and when one is too late.

A call's result is an :class:`Outcome`. Each thread is a slot, held by a call from the moment it
is queued until its thread is done with it *and* its outcome is released (its response is with
the socket); calls beyond the free slots wait on the loop side. So a thread never starts a call
while an earlier one's response is unwritten, and a crash in that call (``os._exit``, a
segfault) cannot take a finished response down with the worker; and the hand-off of the next
call is the wake-up the thread needs anyway, not a second one. A thread cannot be stopped: a
call that outlives its deadline keeps its slot until it returns, and ``oldest_call_age`` lets
the supervisor notice one stuck for good.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

__all__ = ["Call", "Executor", "Outcome", "claim"]

#: What a handler thread runs: it returns a value, and chunks to stream after it (or None).
Call = Callable[[], tuple[Any, Iterator[bytes] | None]]

#: Chunks a streamed body may run ahead of the socket: enough to keep the thread busy while the
#: loop writes, small enough that a slow client does not make the worker buffer the stream.
_STREAM_CREDITS: Final = 4
_END: Final = object()


class _Stream:
    """Chunks produced on a handler thread and consumed on the loop, with backpressure."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._chunks: asyncio.Queue[Any] = asyncio.Queue()
        self._credits = threading.Semaphore(_STREAM_CREDITS)
        self._abandoned = False

    def produce(self, chunks: Iterator[bytes]) -> None:
        """Runs on the handler thread; returns when the body ends or the consumer gave up."""
        try:
            for chunk in chunks:
                self._credits.acquire()
                if self._abandoned:
                    return
                self._loop.call_soon_threadsafe(self._chunks.put_nowait, chunk)
            self._loop.call_soon_threadsafe(self._chunks.put_nowait, _END)
        except Exception as exc:  # handed to the consumer, which cuts the response short
            self._loop.call_soon_threadsafe(self._chunks.put_nowait, exc)
        finally:
            close = getattr(chunks, "close", None)
            if callable(close):
                close()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (item := await self._chunks.get()) is not _END:
            if isinstance(item, Exception):
                raise item
            self._credits.release()
            yield item

    def abandon(self) -> None:
        """The response is over (sent, or the client left): let the producer stop."""
        self._abandoned = True
        self._credits.release()


class _Job:
    """One call for a handler thread; its outcome or error goes to ``future`` on the loop."""

    __slots__ = ("call", "context", "future", "on_done", "ran", "released", "stream")

    def __init__(
        self,
        call: Callable[[], Any],
        future: asyncio.Future[Any],
        on_done: Callable[[], None] | None,
    ) -> None:
        self.call = call
        self.context = contextvars.copy_context()  # the request id follows the call
        self.future = future
        #: Runs on the loop once the thread is done with the job and its outcome is released,
        #: which frees its slot. None for work that answers no request (loading the handler).
        self.on_done = on_done
        self.stream: _Stream | None = None
        self.ran = False  # the thread is done with it, streamed chunks included
        self.released = False  # its outcome was released, or there will be none

    def release(self) -> None:
        """On the loop: the response is with the socket (or never will be)."""
        if self.stream is not None:
            self.stream.abandon()
        if not self.released:
            self.released = True
            self._done_if_both()

    def thread_done(self) -> None:
        """On the loop: the thread has finished the call."""
        self.ran = True
        self._done_if_both()

    def _done_if_both(self) -> None:
        if self.ran and self.released and self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()


class Outcome:
    """A finished call: its value, its chunks as they reach the loop, and ``release()``.

    ``release()`` once the response has been handed to the socket (or abandoned): only then
    does the handler thread start its next call.
    """

    __slots__ = ("_job", "chunks", "value")

    def __init__(self, value: Any, job: _Job) -> None:
        self.value = value
        self.chunks: AsyncIterator[bytes] | None = (
            job.stream.__aiter__() if job.stream is not None else None
        )
        self._job = job

    def release(self) -> None:
        self._job.release()


class Executor:
    """``threads`` handler threads fed from one queue."""

    def __init__(self, *, threads: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._free_slots = threads
        self._waiting: deque[_Job] = deque()  # calls that wait for a slot
        self._busy_since: dict[int, float] = {}
        # Results travel to the loop in batches: one wake-up of the loop per burst, not per call.
        self._results: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._results_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"abeja-handler-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, call: Call, on_done: Callable[[], None]) -> asyncio.Future[Outcome]:
        """Queue a call; ``on_done`` runs on the loop once its thread is done with it and its
        outcome is released."""
        future: asyncio.Future[Outcome] = self._loop.create_future()
        job = _Job(call, future, functools.partial(self._slot_freed, on_done))
        if self._free_slots:
            self._free_slots -= 1
            self._jobs.put(job)
        else:
            self._waiting.append(job)
        return future

    def _slot_freed(self, on_done: Callable[[], None]) -> None:
        on_done()
        while self._waiting:
            job = self._waiting.popleft()
            if not job.future.cancelled():
                self._jobs.put(job)
                return
            job.release()  # given up while it waited for a slot: never started
            job.thread_done()
        self._free_slots += 1

    def run_on_thread(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn`` on a handler thread, e.g. to import the handler module there."""
        future = self._loop.create_future()
        self._jobs.put(_Job(lambda: fn(*args), future, on_done=None))
        return future

    def oldest_call_age(self) -> float | None:
        """Seconds the longest-running call has been running; None when idle."""
        started = min(self._busy_since.values(), default=None)
        return None if started is None else time.monotonic() - started

    def stop_threads(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _work(self) -> None:
        ident = threading.get_ident()
        while (job := self._jobs.get()) is not None:
            if job.future.cancelled():  # given up while it waited: never started
                self._post(self._finish, job, None, None)
                continue
            self._busy_since[ident] = time.monotonic()
            try:
                self._run(job)
            finally:
                del self._busy_since[ident]

    def _run(self, job: _Job) -> None:
        try:
            result = job.context.run(job.call)
        except BaseException as exc:  # handed to the awaiting request, never lost
            self._post(self._finish, job, None, exc)
            return
        if job.on_done is None:
            self._post(self._finish, job, result, None)
            return
        value, chunks = result
        if chunks is None:
            self._post(self._finish, job, Outcome(value, job), None)
            return
        job.stream = _Stream(self._loop)
        self._post(self._finish_head, job, Outcome(value, job))
        job.context.run(job.stream.produce, chunks)
        self._post(self._finish, job, None, None)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with self._results_lock:
            self._results.append((callback, args))
            first = len(self._results) == 1
        if first:
            self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._results_lock:
            results, self._results = self._results, []
        for callback, args in results:
            callback(*args)

    def _finish_head(self, job: _Job, outcome: Outcome) -> None:
        if job.future.cancelled():
            job.release()  # the deadline passed just now; nobody will read the chunks
        else:
            job.future.set_result(outcome)

    def _finish(self, job: _Job, result: Any, exc: BaseException | None) -> None:
        job.thread_done()
        if job.future.done():  # streamed chunks ended, or the call was given up
            if job.future.cancelled():
                job.release()
            return
        if exc is not None:
            job.future.set_exception(exc)
            job.release()
        else:
            job.future.set_result(result)


async def claim(future: asyncio.Future[Outcome]) -> Outcome:
    """Await a call's outcome; one delivered to a caller that gave up meanwhile (deadline,
    client gone) is released here, so that its handler thread is not kept waiting."""
    try:
        return await future
    except BaseException:
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().release()
        raise
