"""The scheduler (``front/pool.py``) with fake processes, on a real event loop: where calls go,
what a crash costs, what waits for a replacement (issue 29: the scheduler tested apart from
processes and sockets)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from abeja_runtime.errors import ServiceBusy, ServiceUnavailable, WorkerCrashed
from abeja_runtime.frames import Call, Cancel
from abeja_runtime.front.pending import PendingCall, ProcessState

from .fakes import FakePool


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def pending(fake: FakePool, cleanups: list[int] | None = None) -> PendingCall:
    call_id = fake.pool.next_id()
    frame = Call(call_id, "GET", "/", "", (), f"id-{call_id}", None, b"", "", 0)
    cleanup = None if cleanups is None else (lambda: cleanups.append(call_id))
    return PendingCall(frame, asyncio.get_running_loop(), None, cleanup)


def test_a_call_waits_in_the_queue_until_a_process_is_ready() -> None:
    async def scenario() -> None:
        fake = FakePool()
        (process,) = fake.made
        assert not fake.pool.admitting  # never ready yet: 503 at once
        process.ready()
        call = pending(fake)
        fake.pool.submit(call)
        assert call.member is process.sink and process.frames == [call.frame]
        process.answer(call.frame.id)
        assert (await call.answer).status == 200
        assert fake.pool.scheduler.admitted == 0

    run(scenario)


def test_calls_go_to_the_least_busy_process_and_a_full_pool_refuses() -> None:
    async def scenario() -> None:
        fake = FakePool(workers=2, max_queue=1)  # room for 2 * (1 + 1) calls
        first, second = fake.made
        first.ready()
        second.ready()
        calls = [pending(fake) for _ in range(4)]
        fake.pool.scheduler.call_time.mean = 1.0  # slow calls: no joining a busy process
        fake.pool.submit(calls[0])
        fake.pool.submit(calls[1])
        assert {calls[0].member, calls[1].member} == {first.sink, second.sink}
        fake.clock.advance(1.0)  # running for a second: nothing is pipelined behind them
        fake.pool.submit(calls[2])
        fake.pool.submit(calls[3])
        assert calls[2].member is None and calls[3].member is None  # queued
        with pytest.raises(ServiceBusy):
            fake.pool.submit(pending(fake))
        first.answer(calls[0].frame.id)
        assert calls[2].member is first.sink  # the queue's head goes to the freed slot

    run(scenario)


def test_a_crash_fails_the_running_call_and_requeues_the_others_for_the_replacement() -> None:
    async def scenario() -> None:
        fake = FakePool()
        (process,) = fake.made
        process.ready()
        running, behind = pending(fake), pending(fake)
        fake.pool.submit(running)
        fake.pool.scheduler.call_time.mean = 0.0  # quick calls: the second joins the busy process
        fake.pool.submit(behind)
        assert behind.member is process.sink
        process.exit(3)
        with pytest.raises(WorkerCrashed):
            await running.answer
        assert behind.member is None and not behind.answer.done()  # back in the queue
        # While the replacement loads, new calls are taken and wait with it.
        assert fake.pool.admitting and not fake.pool.serving
        waiting = pending(fake)
        fake.pool.submit(waiting)
        replacement = fake.made[1]
        assert replacement.sink.state is ProcessState.STARTING
        replacement.ready()
        assert [frame.id for frame in replacement.frames] == [behind.frame.id, waiting.frame.id]

    run(scenario)


def test_replacements_that_keep_dying_refuse_new_calls_and_fail_the_queued_ones() -> None:
    async def scenario() -> None:
        fake = FakePool()
        fake.made[0].ready()
        fake.made[0].exit(3)
        queued = pending(fake)
        fake.pool.submit(queued)  # waits for the first replacement
        fake.made[1].exit(9)  # dies loading: started again at once
        assert fake.pool.admitting
        fake.made[2].exit(9)  # dies loading again: back-off, no process in sight
        assert not fake.pool.admitting
        with pytest.raises(ServiceUnavailable):
            await queued.answer

    run(scenario)


def test_a_withdrawn_call_never_runs_or_is_cancelled_where_it_runs() -> None:
    async def scenario() -> None:
        fake = FakePool()
        (process,) = fake.made
        cleanups: list[int] = []
        queued = pending(fake, cleanups)
        fake.pool.submit(queued)  # no process ready: queued
        fake.pool.withdraw(queued)
        assert cleanups == [queued.frame.id] and fake.pool.scheduler.admitted == 0
        process.ready()
        assert process.frames == []  # it never reaches a process
        running = pending(fake, cleanups)
        fake.pool.submit(running)
        fake.pool.withdraw(running)
        assert process.frames[-1] == Cancel(running.frame.id)
        process.answer(running.frame.id, 504)  # the process's answer to a cancelled call
        assert cleanups == [queued.frame.id, running.frame.id] and fake.pool.scheduler.admitted == 0

    run(scenario)
