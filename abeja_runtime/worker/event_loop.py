"""The executor of ``async def`` handlers (and of async gRPC services): calls as tasks of this
process's event loop. Imported only where needed: asyncio brings the ssl module (OpenSSL), 5 MiB
that a ``def`` handler's process would carry for nothing.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque

from abeja_runtime.worker.client_streams import ClientConnections
from abeja_runtime.worker.runner import Held, Runner
from abeja_runtime.worker.warmup import Warmup

__all__ = ["EventLoop"]


class EventLoop:
    """Frames read by the loop itself, as the socket turns readable; calls run as tasks, at most
    ``concurrency`` at once, in the order they came. A :class:`~abeja_runtime.frames.Cancel`
    cancels its call's task, and a call taken back before it started is given back."""

    def __init__(self, runner: Runner, concurrency: int, loop: str) -> None:
        self._runner = runner
        self._concurrency = concurrency
        self._loop_name = loop
        self._waiting: deque[list[Held]] = deque()
        self._running: dict[int, asyncio.Task[None]] = {}
        #: The calls of the tasks made whose first step is still to come (a cancel gives such a
        #: call back: its task, cancelled now, would never run its ``finally``).
        self._not_started: dict[int, list[Held]] = {}
        runner.credits.wait = runner.credits.wait_on_loop
        if not runner.batching:  # its streams are written to their clients here
            runner.clients = ClientConnections()

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
        runner = self._runner
        if runner.clients is not None:
            runner.clients.make_room()
        if not runner.batching:  # a batch's calls are all answered, never taken back
            runner.take_back = self._take_back
        read_all = loop.create_future()
        fd = runner.channel.fileno()
        # On the loop, not on a thread of its own: a call starts without waking a second
        # thread (and waiting for the GIL) first.
        loop.add_reader(fd, self._readable, read_all)
        # uvloop makes a descriptor it polls non-blocking; the answers' writes wait for room.
        os.set_blocking(fd, True)
        try:
            await read_all
        finally:
            loop.remove_reader(fd)
        runner.credits.close()  # the streams waiting for credit stop
        while self._running:
            await asyncio.wait(list(self._running.values()))

    def _readable(self, read_all: asyncio.Future[None]) -> None:
        """The frames that came: the calls among them started (or held for their batch), in
        order; ``read_all`` done once the front has closed the socket."""
        frames, still_open = self._runner.channel.read_ready()
        dispatch = self._runner.dispatch
        for item in frames:
            calls = dispatch(item)
            if calls is not None:
                self._waiting.append(calls)
        self._start_waiting()
        if not still_open and not read_all.done():
            read_all.set_result(None)

    def _start_waiting(self) -> None:
        waiting, running = self._waiting, self._running
        while waiting and len(running) < self._concurrency:
            calls = waiting.popleft()
            call_id = calls[0][0].id
            self._not_started[call_id] = calls
            running[call_id] = asyncio.create_task(self._run(calls))

    def _take_back(self, call_id: int, cancel: bool) -> None:
        """A call that waits (or whose task has not begun) is given back, a running one's task
        cancelled."""
        for calls in self._waiting:
            frame, fd = calls[0]
            if frame.id == call_id:
                self._waiting.remove(calls)
                self._runner.give_back(frame, fd)
                return
        if call_id in self._not_started:
            calls = self._not_started.pop(call_id)
            self._running.pop(call_id).cancel()
            self._runner.give_back(*calls[0])
            self._start_waiting()
            return
        task = self._running.get(call_id)
        if task is not None and cancel:
            task.cancel()

    async def _run(self, calls: list[Held]) -> None:
        del self._not_started[calls[0][0].id]
        try:
            await self._runner.run(calls)
        except asyncio.CancelledError:
            self._runner.dropped(calls[0][0])
        finally:
            del self._running[calls[0][0].id]
            self._start_waiting()
