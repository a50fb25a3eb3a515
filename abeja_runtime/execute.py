"""Running handler calls: handler threads, a bounded queue, the deadline, streamed bodies.

Sync handlers run on ``concurrency`` dedicated threads that take jobs from one
``queue.SimpleQueue`` and answer the event loop with ``call_soon_threadsafe``; contract A1 measured
this hand-off as the fastest. Jobs wait in that queue, not on the loop, so a thread starts the
next call the moment it finishes one. A job is the whole call: the handler, the encoding of its
result and, for streamed content, the iteration of the generator or file, whose chunks go to the
loop with backpressure. So user code never interleaves with another call, and with the default
concurrency of 1 every call runs on the thread that imported the handler module.

A sync thread cannot be stopped: when the deadline passes, the client gets 504 at once, but the
job keeps its place (and counts against the queue) until the thread really returns.
``oldest_call_age`` lets the supervisor notice a handler stuck for good and recycle its worker.
Async handlers are awaited on the loop, at most ``concurrency`` at once; their results are
encoded on a handler thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerTimeout, ServiceBusy

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - Python 3.10
    from async_timeout import timeout as _timeout

__all__ = ["Execution", "Executor"]

#: Chunks a streamed body may run ahead of the socket: enough to keep the thread busy while the
#: loop writes, small enough that a slow client does not make the worker buffer the stream.
_STREAM_CREDITS: Final = 4
_END: Final = object()
#: A bound on how long a handler thread waits for the loop to send its last response before it
#: takes the next call; only a lost hand-off would ever make it wait this long.
_RELEASE_WAIT: Final = 5.0


class _Job:
    """One call for a handler thread; its result or error goes to ``future`` on the loop."""

    __slots__ = ("call", "context", "future", "on_done", "released", "stream")

    def __init__(
        self,
        call: Callable[[], Any],
        future: asyncio.Future[Any],
        on_done: Callable[[], None] | None,
    ) -> None:
        self.call = call
        self.context = contextvars.copy_context()  # the request id follows the call
        self.future = future
        #: Runs on the loop when the thread is done with the job, streamed body included.
        self.on_done = on_done
        self.stream: _Stream | None = None
        #: Set once the job's response is with the socket (or will never be sent); the thread
        #: waits for it before its next call. None for work that answers no request.
        self.released: threading.Event | None = threading.Event() if on_done else None

    def release(self) -> None:
        if self.released is not None:
            self.released.set()


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


class Execution:
    """A finished call: the encoded head, and the streamed body if there is one.

    ``close()`` once the response has been handed to the socket (or abandoned): only then does
    the handler thread start its next call.
    """

    __slots__ = ("_job", "response", "stream")

    def __init__(self, response: EncodedResponse, job: _Job) -> None:
        self.response = response
        self.stream = job.stream
        self._job = job

    def close(self) -> None:
        if self.stream is not None:
            self.stream.abandon()
        self._job.release()


class Executor:
    """Admits calls: ``concurrency`` run, at most ``max_queue`` more wait, the rest get 503."""

    def __init__(self, *, concurrency: int, max_queue: int, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._concurrency = concurrency
        self._capacity = concurrency + max_queue
        self._pending = 0  # admitted calls whose thread work has not finished
        self._async_slots = asyncio.Semaphore(concurrency)
        self._timeout = timeout
        self._busy_since: dict[int, float] = {}
        # Results travel to the loop in batches: one wake-up of the loop per burst, not per call.
        self._results: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._results_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"abeja-handler-{i}", daemon=True)
            for i in range(concurrency)
        ]
        for thread in self._threads:
            thread.start()

    def run_on_thread(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn`` on a handler thread outside admission (loading the handler module)."""
        future = self._loop.create_future()
        self._jobs.put(_Job(lambda: fn(*args), future, on_done=None))
        return future

    def oldest_call_age(self) -> float | None:
        """Seconds the longest-running handler call has been running; None when idle."""
        started = min(self._busy_since.values(), default=None)
        return None if started is None else time.monotonic() - started

    @property
    def queued(self) -> int:
        """Admitted calls waiting for a handler slot."""
        return max(0, self._pending - self._concurrency)

    def stop_threads(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    async def execute(
        self,
        call: Callable[[], Any],
        *,
        is_async: bool,
        encode: Callable[[Any], EncodedResponse],
    ) -> Execution:
        """Run a call within the deadline.

        For a sync handler ``call`` returns the encoded response and runs on a handler thread;
        for an async one it returns the coroutine, awaited here, and the result is encoded on a
        handler thread.
        """
        if self._pending >= self._capacity:
            raise ServiceBusy()
        deadline = _timeout(self._timeout or None)
        self._pending += 1
        try:
            async with deadline:
                if not is_async:
                    return await _claim(self._submit(call, self._release_sync))
                return await self._execute_async(call, encode)
        except asyncio.TimeoutError:  # not the builtin one before Python 3.11
            if _expired(deadline):
                raise HandlerTimeout(self._timeout) from None
            raise

    async def _execute_async(
        self, call: Callable[[], Any], encode: Callable[[Any], EncodedResponse]
    ) -> Execution:
        handed_over = False
        try:
            await self._async_slots.acquire()
            try:
                result = await call()
                # From here the job owns the slot: it holds it while a body is streamed.
                future = self._submit(lambda: encode(result), self._release_async)
                handed_over = True
            finally:
                if not handed_over:
                    self._async_slots.release()
            return await _claim(future)
        finally:
            if not handed_over:
                self._pending -= 1

    def _release_sync(self) -> None:
        self._pending -= 1

    def _release_async(self) -> None:
        self._pending -= 1
        self._async_slots.release()

    def _submit(
        self, call: Callable[[], Any], on_done: Callable[[], None]
    ) -> asyncio.Future[Execution]:
        future: asyncio.Future[Execution] = self._loop.create_future()
        self._jobs.put(_Job(call, future, on_done))
        return future

    def _work(self) -> None:
        ident = threading.get_ident()
        while (job := self._jobs.get()) is not None:
            if job.future.cancelled():  # timed out while it waited: never started
                self._post(self._finish, job, None, None)
                continue
            self._busy_since[ident] = time.monotonic()
            try:
                self._run(job)
            finally:
                del self._busy_since[ident]
            # The next call waits until this one's response is with the socket, so that a crash
            # in it (os._exit, a segfault) cannot take an answered request down with the worker.
            if job.released is not None:
                job.released.wait(_RELEASE_WAIT)

    def _run(self, job: _Job) -> None:
        try:
            result = job.context.run(job.call)
        except BaseException as exc:  # handed to the awaiting request, never lost
            self._post(self._finish, job, None, exc)
            return
        if isinstance(result, EncodedResponse) and isinstance(result.body, Iterator):
            job.stream = _Stream(self._loop)
            self._post(self._finish_head, job, result)
            job.context.run(job.stream.produce, result.body)
            self._post(self._finish, job, None, None)
        else:
            self._post(self._finish, job, result, None)

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

    def _finish_head(self, job: _Job, response: EncodedResponse) -> None:
        if job.future.cancelled():
            assert job.stream is not None
            job.stream.abandon()  # the deadline passed just now; nobody will read the body
            job.release()
        else:
            job.future.set_result(Execution(response, job))

    def _finish(self, job: _Job, result: Any, exc: BaseException | None) -> None:
        if job.on_done is not None:
            job.on_done()
        if job.future.done():  # a streamed body ended, or the call timed out or was dropped
            if job.future.cancelled():
                job.release()
            return
        if exc is not None:
            job.future.set_exception(exc)
            job.release()
        elif isinstance(result, EncodedResponse):
            job.future.set_result(Execution(result, job))
        else:
            job.future.set_result(result)


async def _claim(future: asyncio.Future[Execution]) -> Execution:
    """Await a call's result; one delivered to a caller that gave up meanwhile (timeout,
    client gone) is closed here, so that its handler thread is not kept waiting."""
    try:
        return await future
    except BaseException:
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().close()
        raise


def _expired(deadline: Any) -> bool:
    expired = deadline.expired
    return bool(expired() if callable(expired) else expired)
