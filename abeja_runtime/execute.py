"""Running handler calls: concurrency slots, a bounded queue, the deadline, streamed bodies.

Each concurrency slot owns one dedicated thread fed by a ``queue.SimpleQueue`` that answers the
event loop with ``call_soon_threadsafe``; the contract measured this hand-off as the fastest
(contract A1), and it keeps every call of a slot on the same thread, where the handler module was
imported, which thread-affine ML libraries like. A request holds its slot from the handler call
until the last chunk of a streamed body, so user code never interleaves with another call.

A sync handler thread cannot be stopped: when a deadline passes, the client gets 504 at once but
the slot stays taken until the thread really returns. ``oldest_call_started`` lets the worker
notice a handler that is stuck for good, so that the supervisor can recycle the process.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from abeja_runtime.encode import EncodedResponse
from abeja_runtime.errors import HandlerTimeout, ServiceBusy, ServiceUnavailable

if sys.version_info >= (3, 11):
    from asyncio import timeout as _timeout
else:  # pragma: no cover - Python 3.10
    from async_timeout import timeout as _timeout

__all__ = ["Execution", "Executor", "Slot"]

T = TypeVar("T")
_Job = tuple[asyncio.Future[Any], contextvars.Context, Callable[..., Any], tuple[Any, ...]]
_END = object()


class Slot:
    """One concurrency slot and the thread that runs its calls."""

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, on_idle: Callable) -> None:
        self._loop = loop
        self._on_idle = on_idle
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._outstanding = 0
        self._release_when_idle = False
        #: ``time.monotonic()`` when the running call started, or None while the thread is idle.
        self.busy_since: float | None = None
        self._thread = threading.Thread(
            target=self._work, name=f"abeja-handler-{index}", daemon=True
        )
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on this slot's thread, in a copy of the caller's context."""
        future: asyncio.Future[T] = self._loop.create_future()
        self._outstanding += 1
        self._jobs.put((future, contextvars.copy_context(), fn, args))
        return future

    def release(self) -> None:
        """Give the slot back now, or as soon as its thread has finished what it is running."""
        if self._outstanding:
            self._release_when_idle = True
        else:
            self._on_idle(self)

    def stop(self) -> None:
        self._jobs.put(None)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, context, fn, args = job
            self.busy_since = time.monotonic()
            try:
                result = context.run(fn, *args)
            except BaseException as exc:  # handed to the awaiting request, never lost
                self._loop.call_soon_threadsafe(self._done, future, None, exc)
            else:
                self._loop.call_soon_threadsafe(self._done, future, result, None)
            finally:
                self.busy_since = None

    def _done(self, future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
        self._outstanding -= 1
        if not future.done():
            if exc is None:
                future.set_result(result)
            else:
                future.set_exception(exc)
        if self._release_when_idle and not self._outstanding:
            self._release_when_idle = False
            self._on_idle(self)


class Executor:
    """Admits requests to ``concurrency`` slots; at most ``max_queue`` may wait for one."""

    def __init__(self, *, concurrency: int, max_queue: int, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._slots = [Slot(i, loop, self._on_idle) for i in range(concurrency)]
        self._idle: deque[Slot] = deque(self._slots)
        self._waiters: deque[asyncio.Future[Slot]] = deque()
        self._max_queue = max_queue
        self._timeout = timeout
        self._closed_reason: str | None = None

    @property
    def first_slot(self) -> Slot:
        return self._slots[0]

    def oldest_call_started(self) -> float | None:
        started = [slot.busy_since for slot in self._slots if slot.busy_since is not None]
        return min(started, default=None)

    def close(self, reason: str = "service unavailable") -> None:
        """Refuse new calls and fail the queued ones (shutdown, or a stuck worker retiring)."""
        self._closed_reason = reason
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ServiceUnavailable(reason))

    def stop_threads(self) -> None:
        for slot in self._slots:
            slot.stop()

    async def execute(
        self,
        call: Callable[[], EncodedResponse] | Callable[[], Any],
        *,
        is_async: bool,
        encode: Callable[[Any], EncodedResponse],
    ) -> Execution:
        """Run ``call`` within the deadline and return the execution, which holds the slot.

        For a sync handler ``call`` returns the encoded response (it runs on the slot thread);
        for an async one it returns the coroutine's result, which is encoded on the slot thread.
        """
        slot: Slot | None = None
        deadline = _timeout(self._timeout or None)
        try:
            async with deadline:
                slot = await self._acquire()
                if is_async:
                    result = await call()
                    response = await slot.run(encode, result)
                else:
                    response = await slot.run(call)
        except TimeoutError:
            if slot is not None:
                slot.release()
            if _expired(deadline):
                raise HandlerTimeout(self._timeout) from None
            raise
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        return Execution(slot, response)

    async def _acquire(self) -> Slot:
        if self._closed_reason is not None:
            raise ServiceUnavailable(self._closed_reason)
        if self._idle and not self._waiters:
            return self._idle.popleft()
        if len(self._waiters) >= self._max_queue:
            raise ServiceBusy()
        waiter: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().release()  # handed over just as we gave up: pass it on
            else:
                self._waiters.remove(waiter)
            raise

    def _on_idle(self, slot: Slot) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._idle.append(slot)


class Execution:
    """A finished handler call whose slot is held until :meth:`close` (after the body is sent)."""

    __slots__ = ("_closed", "_slot", "response")

    def __init__(self, slot: Slot, response: EncodedResponse) -> None:
        self._slot = slot
        self._closed = False
        self.response = response

    async def chunks(self) -> AsyncIterator[bytes]:
        """The streamed body, each chunk produced on the slot's thread."""
        body = self.response.body
        assert isinstance(body, Iterator)
        while (chunk := await self._slot.run(next, body, _END)) is not _END:
            yield chunk

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        body = self.response.body
        if isinstance(body, Iterator):
            close = getattr(body, "close", None)
            if callable(close):
                # Runs the user's cleanup on the slot's thread; the slot is freed after it.
                self._slot.run(close).add_done_callback(_consume)
        self._slot.release()


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a fire-and-forget result so that asyncio does not warn about it."""
    if not future.cancelled():
        future.exception()


def _expired(deadline: Any) -> bool:
    expired = deadline.expired
    return bool(expired() if callable(expired) else expired)
