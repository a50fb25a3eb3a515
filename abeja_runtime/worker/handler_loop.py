"""The handler process's event loop, for ``async def`` handlers and async gRPC styles.

Imported only by the handler processes that need it: asyncio brings the ssl module (OpenSSL),
5 MiB of memory that a ``def`` handler's process would carry for nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable
from typing import Any, Protocol

from abeja_runtime.frames import BlockingChannel, Call, Cancel, Frame, GiveBack, RpcCall

__all__ = ["CallRunner", "run_until_done", "serve_on_loop"]


class CallRunner(Protocol):
    """What runs the calls (:class:`abeja_runtime.worker.process._Calls`)."""

    channel: BlockingChannel

    async def run_async(self, frame: Frame, fd: int | None) -> None: ...

    def give_back(self, frame: Call | RpcCall, fd: int | None) -> None: ...

    def dropped(self, frame: Call | RpcCall) -> None: ...

    def front_gone(self) -> None: ...


def serve_on_loop(calls: CallRunner, concurrency: int, loop: str) -> None:
    """Serve the calls on an event loop (``loop``: ``uvloop`` or ``asyncio``) until the front
    closes the socket, and the calls started by then are answered."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(_serve(calls, concurrency))
    else:
        asyncio.run(_serve(calls, concurrency))


def run_until_done(awaitable: Awaitable[Any]) -> None:
    """Await ``awaitable`` on a loop of its own (a style's async teardown)."""

    async def wait() -> None:
        await awaitable

    asyncio.run(wait())


async def _serve(calls: CallRunner, concurrency: int) -> None:
    """Calls read on a thread of their own and run as tasks, at most ``concurrency`` at once,
    in the order they came; a :class:`~abeja_runtime.frames.Cancel` cancels its call's task,
    and a call taken back before it started is given back."""
    loop = asyncio.get_running_loop()
    waiting: deque[tuple[Call | RpcCall, int | None]] = deque()
    running: dict[int, asyncio.Task[None]] = {}
    read_all = loop.create_future()

    def start_waiting() -> None:
        while waiting and len(running) < concurrency:
            frame, fd = waiting.popleft()
            running[frame.id] = asyncio.create_task(run(frame, fd))

    def take_back(call_id: int, *, cancel_running: bool) -> None:
        for item in waiting:
            if item[0].id == call_id:
                waiting.remove(item)
                calls.give_back(*item)
                return
        task = running.get(call_id)
        if task is not None and cancel_running:
            task.cancel()

    def arrived(item: tuple[Frame, int | None] | None) -> None:
        if item is None:
            read_all.set_result(None)
            return
        frame, fd = item
        match frame:
            case Call() | RpcCall():
                waiting.append((frame, fd))
                start_waiting()
            case Cancel():
                take_back(frame.id, cancel_running=True)
            case GiveBack():
                take_back(frame.id, cancel_running=False)
            case _:  # the channel keeps Credit; Start came first, and only once
                raise AssertionError(f"a {type(frame).__name__} frame among the calls")

    def read() -> None:
        while True:
            item = calls.channel.read()
            if item is None:
                calls.front_gone()  # streams waiting for credit stop
            loop.call_soon_threadsafe(arrived, item)
            if item is None:
                return

    async def run(frame: Call | RpcCall, fd: int | None) -> None:
        try:
            await calls.run_async(frame, fd)
        except asyncio.CancelledError:
            calls.dropped(frame)
        finally:
            del running[frame.id]
            start_waiting()

    threading.Thread(target=read, name="abeja-frames", daemon=True).start()
    await read_all
    while running:  # the calls started before the front closed the socket end
        await asyncio.wait(list(running.values()))
