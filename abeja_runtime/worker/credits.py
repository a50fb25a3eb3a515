"""How many more chunks each streamed answer of this process may send (its credit).

A stream starts with :data:`~abeja_runtime.frames.STREAM_WINDOW` chunks and
:data:`~abeja_runtime.frames.STREAM_WINDOW_BYTES` bytes of credit; each chunk sent spends one
chunk and its size, and the front gives them back (:class:`~abeja_runtime.frames.Credit`) as the
client takes the chunks. A chunk may go while some of both is left, so a chunk bigger than the
window still goes, alone. A stream without credit waits before it asks its generator for more,
so a client that reads slowly holds up its own generator, not the front's memory nor the other
calls of this process (the front no longer has to stop reading the whole socket).

Whichever thread reads the frames grants the credit (:class:`~abeja_runtime.frames.
BlockingChannel`); a stream waits for it in the way of the thread it runs on:

* on a handler thread, or on the event loop's thread while a reader thread reads: an event
  (:meth:`StreamCredits.wait`), or a future of the loop (:meth:`StreamCredits.wait_async`);
* on the main thread of a process whose main thread reads the frames itself (a ``def`` handler
  at ``--concurrency 1``): it reads them (``BlockingChannel.wait_until``) until
  :meth:`StreamCredits.has_credit`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from abeja_runtime.frames import STREAM_WINDOW, STREAM_WINDOW_BYTES

if TYPE_CHECKING:
    import asyncio

__all__ = ["StreamCredits"]


class StreamCredits:
    """The credit of each stream that runs here, and the waiter of each that has none."""

    __slots__ = ("_closed", "_left", "_lock", "_wake")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The chunks and bytes each stream may still send (bytes may go below zero: the chunk
        #: that crossed the window went whole).
        self._left: dict[int, list[int]] = {}
        #: How to wake the stream of each id that waits (a thread's event, a loop's future).
        self._wake: dict[int, Callable[[], None]] = {}
        #: The front closed the socket: no credit will come, nobody waits.
        self._closed = False

    def open(self, call_id: int) -> None:
        with self._lock:
            self._left[call_id] = [STREAM_WINDOW, STREAM_WINDOW_BYTES]

    def finished(self, call_id: int) -> None:
        with self._lock:
            self._left.pop(call_id, None)
            self._wake.pop(call_id, None)

    def spend(self, call_id: int, size: int) -> bool:
        """Spend the credit of a chunk of ``size`` bytes; ``False`` when there is none left
        (then wait for it)."""
        with self._lock:
            left = self._left.get(call_id)
            if left is None or left[0] <= 0 or left[1] <= 0:
                return False
            left[0] -= 1
            left[1] -= size
            return True

    @property
    def closed(self) -> bool:
        return self._closed

    def has_credit(self, call_id: int) -> bool:
        return self._closed or _positive(self._left.get(call_id))

    def grant(self, call_id: int, chunks: int, size: int) -> None:
        """The front's :class:`~abeja_runtime.frames.Credit` (on the thread that read it)."""
        with self._lock:
            left = self._left.get(call_id)
            if left is None:
                return  # a stream over already
            left[0] += chunks
            left[1] += size
            if not _positive(left):
                return
            wake = self._wake.pop(call_id, None)
        if wake is not None:
            wake()

    def stop_waiting(self, call_id: int) -> None:
        """The call was cancelled: its stream stops waiting (and stops)."""
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

    def wait(self, call_id: int, cancelled: Callable[[], bool]) -> None:
        """Block this thread until the stream has credit, is cancelled, or the front is gone."""
        event = threading.Event()
        if self._waiting(call_id, event.set, cancelled):
            event.wait()

    async def wait_async(self, call_id: int, cancelled: Callable[[], bool]) -> None:
        """:meth:`wait` for a stream on an event loop (granted on the reader's thread)."""
        import asyncio  # running: imported already (a def handler's process never imports it)

        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_set_once, future)

        if self._waiting(call_id, wake, cancelled):
            await future

    def _waiting(
        self, call_id: int, wake: Callable[[], None], cancelled: Callable[[], bool]
    ) -> bool:
        """Register ``wake`` unless there is nothing to wait for (checked under the lock, so
        that a grant or a cancel cannot slip between the check and the registration; a cancel
        marks the call before it calls :meth:`stop_waiting`)."""
        with self._lock:
            if self._closed or _positive(self._left.get(call_id)) or cancelled():
                return False
            self._wake[call_id] = wake
            return True


def _positive(left: list[int] | None) -> bool:
    """Whether a stream with ``left`` credit may send a chunk."""
    return left is not None and left[0] > 0 and left[1] > 0


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
