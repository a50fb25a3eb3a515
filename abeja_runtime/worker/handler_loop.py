"""The handler process's event loop, for ``async def`` handlers and async gRPC styles.

Imported only by the handler processes that need it: asyncio brings the ssl module (OpenSSL),
5 MiB of memory that a ``def`` handler's process would carry for nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from abeja_runtime.frames import (
    BlockingChannel,
    Call,
    Cancel,
    Frame,
    GiveBack,
    RpcCall,
    RunBatch,
)

__all__ = ["CallRunner", "run_until_done", "serve_on_loop"]


class CallRunner(Protocol):
    """What runs the calls (:class:`abeja_runtime.worker.process._Calls`)."""

    channel: BlockingChannel
    #: Batch mode: calls are held (:meth:`hold`) until the :class:`RunBatch` that runs them.
    batched: bool

    def hold(self, frame: Call, fd: int | None) -> None: ...

    async def run_async(self, frame: Frame, fd: int | None) -> None: ...

    def give_back(self, frame: Call | RpcCall, fd: int | None) -> None: ...

    def dropped(self, frame: Call | RpcCall) -> None: ...

    def front_gone(self) -> None: ...


def serve_on_loop(
    calls: CallRunner, concurrency: int, loop: str, first: Callable[[], Awaitable[None]]
) -> None:
    """Serve the calls on an event loop (``loop``: ``uvloop`` or ``asyncio``) until the front
    closes the socket, and the calls started by then are answered. ``first`` runs on that loop
    before a call is read: the warm-up, which says Ready at its end (``warmup.py``), on the
    loop the calls run on, so that what the handler binds to its first call's loop (a client
    session, a lock) serves the calls too."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(_serve(calls, concurrency, first))
    else:
        asyncio.run(_serve(calls, concurrency, first))


def run_until_done(awaitable: Awaitable[Any]) -> None:
    """Await ``awaitable`` on a loop of its own (a style's async teardown)."""

    async def wait() -> None:
        await awaitable

    asyncio.run(wait())


async def _serve(calls: CallRunner, concurrency: int, first: Callable[[], Awaitable[None]]) -> None:
    await first()
    await _LoopCalls(calls, concurrency, asyncio.get_running_loop()).serve()


class _LoopCalls:
    """Calls read on a thread of their own and run as tasks, at most ``concurrency`` at once,
    in the order they came; a :class:`~abeja_runtime.frames.Cancel` cancels its call's task,
    and a call taken back before it started is given back."""

    def __init__(
        self, calls: CallRunner, concurrency: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        self._calls = calls
        self._concurrency = concurrency
        self._loop = loop
        self._waiting: deque[tuple[Call | RpcCall | RunBatch, int | None]] = deque()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._read_all: asyncio.Future[None] = loop.create_future()

    async def serve(self) -> None:
        """Until the front closes the socket, and the calls started by then are answered."""
        threading.Thread(target=self._read, name="abeja-frames", daemon=True).start()
        await self._read_all
        while self._running:
            await asyncio.wait(list(self._running.values()))

    def _read(self) -> None:
        """The reading thread: each frame handed to the loop, in order."""
        calls = self._calls
        while True:
            item = calls.channel.read()
            if item is None:
                calls.front_gone()  # streams waiting for credit stop
            self._loop.call_soon_threadsafe(self._arrived, item)
            if item is None:
                return

    def _arrived(self, item: tuple[Frame, int | None] | None) -> None:
        if item is None:
            self._read_all.set_result(None)
            return
        frame, fd = item
        match frame:
            case Call() if self._calls.batched:
                self._calls.hold(frame, fd)
            case Call() | RpcCall() | RunBatch():
                self._waiting.append((frame, fd))
                self._start_waiting()
            case Cancel():
                self._take_back(frame.id, cancel_running=True)
            case GiveBack():
                self._take_back(frame.id, cancel_running=False)
            case _:  # the channel keeps Credit; Start came first, and only once
                raise AssertionError(f"a {type(frame).__name__} frame among the calls")

    def _start_waiting(self) -> None:
        waiting, running = self._waiting, self._running
        while waiting and len(running) < self._concurrency:
            frame, fd = waiting.popleft()
            running[_task_key(frame)] = asyncio.create_task(self._run(frame, fd))

    def _take_back(self, call_id: int, *, cancel_running: bool) -> None:
        for item in self._waiting:
            frame, fd = item
            if not isinstance(frame, RunBatch) and frame.id == call_id:
                self._waiting.remove(item)
                self._calls.give_back(frame, fd)
                return
        task = self._running.get(call_id)
        if task is not None and cancel_running:
            task.cancel()

    async def _run(self, frame: Call | RpcCall | RunBatch, fd: int | None) -> None:
        try:
            await self._calls.run_async(frame, fd)
        except asyncio.CancelledError:
            if not isinstance(frame, RunBatch):  # a batch's calls are not cancelled: its
                self._calls.dropped(frame)  # neighbours of a call that was wait for it
        finally:
            del self._running[_task_key(frame)]
            self._start_waiting()


def _task_key(frame: Call | RpcCall | RunBatch) -> int:
    """A call's id; for a batch, one no call has (a :class:`Cancel` of one of its calls does
    not cancel the batch: its neighbours are answered)."""
    return -frame.ids[0] if isinstance(frame, RunBatch) else frame.id
