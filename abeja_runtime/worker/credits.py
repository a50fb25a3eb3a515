"""The credit of each streamed answer of this process, and how a stream without credit waits.

A stream starts with :data:`~abeja_runtime.frames.STREAM_WINDOW` chunks and
:data:`~abeja_runtime.frames.STREAM_WINDOW_BYTES` bytes of credit, spends one chunk and its size
per chunk sent (a chunk may go while some of both is left), and gets them back
(:class:`~abeja_runtime.frames.Credit`) as the client takes the chunks. Without credit it waits
before it asks its generator for more: a slow client holds up only its own generator.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from abeja_runtime.frames import STREAM_WINDOW, STREAM_WINDOW_BYTES, BlockingChannel, Call, RpcCall
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.invoke import settled

__all__ = ["StreamCredits"]


class StreamCredits:
    """The credit of each stream that runs here, and the waiter of each that has none."""

    __slots__ = ("_cancellations", "_closed", "_left", "_lock", "_wake", "wait")

    def __init__(self, cancellations: Cancellations) -> None:
        self._cancellations = cancellations
        self._lock = threading.Lock()
        #: The chunks and bytes each stream may still send (bytes may go below zero: the chunk
        #: that crossed the window went whole).
        self._left: dict[int, list[int]] = {}
        #: How to wake the stream of each id that waits (a thread's event, a loop's future).
        self._wake: dict[int, Callable[[], object]] = {}
        #: The front closed the socket: no credit will come, nobody waits.
        self._closed = False
        #: How a stream without credit waits for it (chosen by the executor).
        self.wait: Callable[[int], Awaitable[None] | None] = self.wait_on_event

    def open(self, call_id: int) -> None:
        with self._lock:
            self._left[call_id] = [STREAM_WINDOW, STREAM_WINDOW_BYTES]

    def finished(self, call_id: int) -> None:
        with self._lock:
            self._left.pop(call_id, None)
            self._wake.pop(call_id, None)

    def spend(self, call_id: int, size: int) -> bool:
        """Spend the credit of a chunk of ``size`` bytes; ``False`` when there is none left
        (then :meth:`take` waits for it)."""
        with self._lock:
            left = self._left.get(call_id)
            if left is None or left[0] <= 0 or left[1] <= 0:
                return False
            left[0] -= 1
            left[1] -= size
            return True

    async def take(self, call_id: int, size: int) -> bool:
        """Spend the credit of a chunk of ``size`` bytes, waiting for it while the client has not
        taken the chunks before; ``False`` once the call was cancelled or the front is gone."""
        while not self.spend(call_id, size):
            if self._closed or self._cancellations.is_cancelled(call_id):
                return False
            await settled(self.wait(call_id))
        return True

    def grant(self, call_id: int, chunks: int, size: int) -> None:
        """The front's :class:`~abeja_runtime.frames.Credit` (on the thread that read it)."""
        with self._lock:
            left = self._left.get(call_id)
            if left is None:
                return  # a stream over already
            left[0] += chunks
            left[1] += size
            if left[0] <= 0 or left[1] <= 0:
                return
        self.stop_waiting(call_id)

    def stop_waiting(self, call_id: int) -> None:
        """The stream goes on (it has credit, or it was cancelled: then it stops)."""
        with self._lock:
            wake = self._wake.pop(call_id, None)
        if wake is not None:
            wake()

    def close(self) -> None:
        """The front closed the socket: every waiting stream stops waiting."""
        with self._lock:
            self._closed = True
            wakes = list(self._wake.values())
            self._wake.clear()
        for wake in wakes:
            wake()

    def wait_on_event(self, call_id: int) -> None:
        """Block this thread until the stream has credit, is cancelled or the front is gone."""
        event = threading.Event()
        if self._waiting(call_id, event.set):
            event.wait()

    def wait_on_loop(self, call_id: int) -> Awaitable[None] | None:
        """The same as a future of the running event loop, which reads the frames itself."""
        import asyncio  # running: imported already (a def handler's process never imports it)

        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return future if self._waiting(call_id, functools.partial(_set_once, future)) else None

    def wait_reading(
        self, channel: BlockingChannel, give_back: Callable[[Call | RpcCall, int | None], None]
    ) -> None:
        """From now on a stream waits by reading the frames until its credit comes (on the
        main thread of a process whose main thread reads them, between its calls)."""

        def wait(call_id: int) -> None:
            if not channel.wait_until(lambda: self._goes_on(call_id), give_back):
                self.close()

        self.wait = wait

    def _waiting(self, call_id: int, wake: Callable[[], object]) -> bool:
        """Register ``wake`` unless there is nothing to wait for (checked under the lock, so
        that a grant or a cancel cannot slip between the check and the registration; a cancel
        marks the call before it calls :meth:`stop_waiting`)."""
        with self._lock:
            if self._goes_on(call_id):
                return False
            self._wake[call_id] = wake
            return True

    def _goes_on(self, call_id: int) -> bool:
        """Whether the stream need not wait: it has credit, it was cancelled, the front is gone."""
        left = self._left.get(call_id)
        return (
            self._closed
            or (left is not None and left[0] > 0 and left[1] > 0)
            or self._cancellations.is_cancelled(call_id)
        )


def _set_once(future: Any) -> None:
    if not future.done():  # not cancelled with its task meanwhile
        future.set_result(None)
