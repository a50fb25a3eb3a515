"""Where a handler process's calls run, chosen once at start (``process.py``): the main thread,
N threads, or the event loop (``event_loop.py``). Each warms the handler up where the calls will
run (``warmup.py``), then runs the calls the runner reads (``runner.py``).
"""

from __future__ import annotations

import queue
import threading
from typing import Final, Protocol

from abeja_runtime.worker.invoke import finish
from abeja_runtime.worker.runner import Held, Runner
from abeja_runtime.worker.warmup import Warmup

__all__ = ["Executor", "MainThread", "Threads"]

#: How often the main thread's watch looks whether its call is slow, and then gives back the
#: calls the front takes back (the front asks for them 50 ms into a call).
_SLOW_CALL_LOOK: Final = 0.02


class Executor(Protocol):
    def serve(self, warmup: Warmup) -> None:
        """Warm up, then serve until the front closes the socket and the calls are answered."""


class MainThread:
    """A ``def`` handler at ``--concurrency 1``: each call on the main thread, the one that
    imported the handler, which reads the next frame only once the call is answered (a crash
    loses only the call that ran: the calls sent and not started are still the front's)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        runner.credits.wait_reading(runner.channel, runner.give_back)
        self._calls_started = 0
        self._in_call = False

    def serve(self, warmup: Warmup) -> None:
        finish(self._serve(warmup))

    async def _serve(self, warmup: Warmup) -> None:
        await warmup.run()
        runner = self._runner
        stopped = threading.Event()
        threading.Thread(
            target=self._watch, args=(stopped,), name="abeja-slow-call-watch", daemon=True
        ).start()
        for calls in runner.calls():
            self._calls_started += 1
            self._in_call = True
            await runner.run(calls)
            self._in_call = False
        stopped.set()

    def _watch(self, stopped: threading.Event) -> None:
        """While a call runs on the main thread, nothing reads the socket: this thread does once
        the call is slow, and gives back the calls behind it that the front takes back. The
        main thread only counts its calls: no lock, clock or system call per call."""
        seen = -1
        while not stopped.wait(_SLOW_CALL_LOOK):
            started = self._calls_started
            if self._in_call and started == seen:  # the same call as a look ago
                for frame, fd in self._runner.channel.taken_back():
                    self._runner.give_back(frame, fd)
            seen = started


class Threads:
    """A ``def`` handler at ``--concurrency N``: ``N`` handler threads, fed in the order the
    calls came, each writing its own answers."""

    def __init__(self, runner: Runner, count: int) -> None:
        self._runner = runner
        self._count = count

    def serve(self, warmup: Warmup) -> None:
        finish(warmup.run())
        jobs: queue.SimpleQueue[list[Held] | None] = queue.SimpleQueue()
        pool = [
            threading.Thread(target=finish, args=(self._work(jobs),), name=f"abeja-handler-{i}")
            for i in range(self._count)
        ]
        for thread in pool:
            thread.start()
        for calls in self._runner.calls():
            jobs.put(calls)
        for _ in pool:
            jobs.put(None)
        for thread in pool:
            thread.join()

    async def _work(self, jobs: queue.SimpleQueue[list[Held] | None]) -> None:
        while (calls := jobs.get()) is not None:
            await self._runner.run(calls)
