"""The executor of ``async def`` handlers (and of async gRPC services): calls as tasks of this
process's event loop. Imported only where needed: asyncio brings the ssl module (OpenSSL), 5 MiB
that a ``def`` handler's process would carry for nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from abeja_runtime.worker.runner import Held, Runner
from abeja_runtime.worker.warmup import Warmup

__all__ = ["EventLoop"]


class EventLoop:
    """Frames read on a thread of their own; calls run as tasks, at most ``concurrency`` at
    once, in the order they came. A :class:`~abeja_runtime.frames.Cancel` cancels its call's
    task, and a call taken back before it started is given back."""

    def __init__(self, runner: Runner, concurrency: int, loop: str) -> None:
        self._runner = runner
        self._concurrency = concurrency
        self._loop_name = loop
        self._waiting: deque[list[Held]] = deque()
        self._running: dict[int, asyncio.Task[None]] = {}
        runner.credits.wait = runner.credits.wait_on_loop

    def serve(self, warmup: Warmup) -> None:
        """On ``uvloop`` or ``asyncio``'s loop, the warm-up first: what the handler binds to its
        first call's loop (a client session, a lock) serves the calls too."""
        if self._loop_name == "uvloop":
            import uvloop

            uvloop.run(self._serve(warmup))
        else:
            asyncio.run(self._serve(warmup))

    async def _serve(self, warmup: Warmup) -> None:
        await warmup.run()
        loop = asyncio.get_running_loop()
        if not self._runner.batching:  # a batch's calls are all answered, never taken back
            self._runner.take_back = lambda call_id, cancel: loop.call_soon_threadsafe(
                self._take_back, call_id, cancel
            )
        read_all = loop.create_future()
        threading.Thread(
            target=self._read, args=(loop, read_all), name="abeja-frames", daemon=True
        ).start()
        await read_all
        while self._running:
            await asyncio.wait(list(self._running.values()))

    def _read(self, loop: asyncio.AbstractEventLoop, read_all: asyncio.Future[None]) -> None:
        """The reading thread: the calls handed to the loop, in order."""
        for calls in self._runner.calls():
            loop.call_soon_threadsafe(self._arrived, calls)
        loop.call_soon_threadsafe(read_all.set_result, None)

    def _arrived(self, calls: list[Held]) -> None:
        self._waiting.append(calls)
        self._start_waiting()

    def _start_waiting(self) -> None:
        waiting, running = self._waiting, self._running
        while waiting and len(running) < self._concurrency:
            calls = waiting.popleft()
            running[calls[0][0].id] = asyncio.create_task(self._run(calls))

    def _take_back(self, call_id: int, cancel: bool) -> None:
        """A call that waits is given back, a running one's task cancelled."""
        for calls in self._waiting:
            frame, fd = calls[0]
            if frame.id == call_id:
                self._waiting.remove(calls)
                self._runner.give_back(frame, fd)
                return
        task = self._running.get(call_id)
        if task is not None and cancel:
            task.cancel()

    async def _run(self, calls: list[Held]) -> None:
        try:
            await self._runner.run(calls)
        except asyncio.CancelledError:
            self._runner.dropped(calls[0][0])
        finally:
            del self._running[calls[0][0].id]
            self._start_waiting()
