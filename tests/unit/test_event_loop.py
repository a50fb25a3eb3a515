"""The event loop's executor (``worker/event_loop.py``): calls as tasks, taken back by the
front's cancels, with a stand-in runner and no socket."""

from __future__ import annotations

import asyncio
from typing import Any

from abeja_runtime.frames import Call
from abeja_runtime.worker.event_loop import EventLoop


class _Credits:
    wait: Any = None

    def wait_on_loop(self, call_id: int) -> None:
        raise AssertionError("no stream here")


class _Runner:
    """What the executor asks of its runner, recorded."""

    def __init__(self) -> None:
        self.credits = _Credits()
        self.batching = False
        self.clients = None
        self.ran: list[int] = []
        self.given_back: list[int] = []
        self.answered_dropped: list[int] = []

    async def run(self, calls: list[Any]) -> None:
        self.ran.append(calls[0][0].id)
        await asyncio.sleep(0)

    def give_back(self, frame: Call, fd: int | None) -> None:
        self.given_back.append(frame.id)

    def dropped(self, frame: Call) -> None:
        self.answered_dropped.append(frame.id)


def _call(call_id: int) -> list[tuple[Call, None]]:
    return [(Call(call_id, "POST", "/", "", (), f"rid-{call_id}", None, b"{}", "", 2), None)]


def test_a_call_cancelled_before_its_task_begins_is_given_back_and_its_place_freed() -> None:
    """The front's cancel can be read in the loop's turn that made the call's task, before the
    task's first step: the call is given back (its task never runs), and the next call takes its
    place. Before, the task was cancelled unstarted, its ``finally`` never ran, and its place
    stayed taken for good."""

    async def scenario() -> tuple[_Runner, EventLoop]:
        runner = _Runner()
        executor = EventLoop(runner, 1, "asyncio")  # type: ignore[arg-type]
        executor._waiting.extend([_call(1), _call(2)])
        executor._start_waiting()  # call 1's task is made; its first step is to come
        executor._take_back(1, True)  # its cancel, read in the same turn
        for _ in range(10):  # the loop's turns: call 2 runs and ends
            await asyncio.sleep(0)
        return runner, executor

    runner, executor = asyncio.run(scenario())
    assert runner.given_back == [1] and runner.ran == [2] and runner.answered_dropped == []
    assert not executor._running and not executor._not_started


def test_a_running_call_s_cancel_cancels_its_task_and_answers_it_dropped() -> None:
    async def scenario() -> _Runner:
        runner = _Runner()
        executor = EventLoop(runner, 1, "asyncio")  # type: ignore[arg-type]
        gate = asyncio.Event()

        async def run(calls: list[Any]) -> None:
            runner.ran.append(calls[0][0].id)
            await gate.wait()  # never set: it runs until cancelled

        runner.run = run  # type: ignore[method-assign]
        executor._waiting.append(_call(1))
        executor._start_waiting()
        await asyncio.sleep(0)  # its first step: it runs
        executor._take_back(1, True)
        for _ in range(10):
            await asyncio.sleep(0)
        assert not executor._running
        return runner

    runner = asyncio.run(scenario())
    assert runner.ran == [1] and runner.answered_dropped == [1] and runner.given_back == []
