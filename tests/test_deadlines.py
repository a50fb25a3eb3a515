"""The front's deadlines: calls gathered into slots, each expired once its own deadline passed.

A running front's 504 at the deadline is tested end to end (``test_reliability.py`` and
``test_faults.py``); here, on a real event loop, the slots themselves: never early, at most
one resolution late, and an answered call is not expired.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from abeja_runtime.front.deadlines import RESOLUTION, Deadlines


class Call:
    """Stands for a call in flight: the slots only hold it and hand it back."""


def run(scenario: Any) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_each_call_is_expired_after_its_deadline_and_within_the_resolution() -> None:
    async def scenario() -> dict[Call, float]:
        expired: dict[Call, float] = {}
        done = asyncio.Event()
        calls = [Call() for _ in range(6)]

        def expire(call: Any) -> None:
            expired[call] = time.time()
            if len(expired) == len(calls):
                done.set()

        deadlines = Deadlines(asyncio.get_running_loop(), expire)
        start = time.time()
        wanted = {}
        for index, call in enumerate(calls):  # two per slot, and slots out of order
            wanted[call] = start + 0.05 + (index % 3) * 0.013 + (index // 3) * 0.001
            deadlines.watch(call, wanted[call])
        await done.wait()
        return {call: expired[call] - wanted[call] for call in calls}

    lateness = run(scenario)
    assert len(lateness) == 6
    for late in lateness.values():
        # Never early; late by the slot's width, plus the loop's own scheduling on a busy machine.
        assert 0 <= late < RESOLUTION + 0.25


def test_an_answered_call_leaves_its_slot_and_is_not_expired() -> None:
    async def scenario() -> list[Call]:
        expired: list[Call] = []
        done = asyncio.Event()

        def expire(call: Any) -> None:
            expired.append(call)
            done.set()

        deadlines = Deadlines(asyncio.get_running_loop(), expire)
        answered, late = Call(), Call()
        deadline = time.time() + 0.03
        slot = deadlines.watch(answered, deadline)
        assert deadlines.watch(late, deadline) is slot
        slot.discard(answered)
        await done.wait()
        return expired

    assert len(run(scenario)) == 1


def test_a_deadline_already_past_is_expired_on_the_next_turn_of_the_loop() -> None:
    async def scenario() -> bool:
        expired = asyncio.Event()
        deadlines = Deadlines(asyncio.get_running_loop(), lambda call: expired.set())
        deadlines.watch(Call(), time.time() - 5)
        assert not expired.is_set()
        await expired.wait()
        return True

    assert run(scenario)


def test_slots_whose_calls_were_all_answered_are_not_kept_until_their_time() -> None:
    async def scenario() -> tuple[int, int]:
        deadlines = Deadlines(asyncio.get_running_loop(), lambda call: None)
        slow = Call()
        deadlines.watch(slow, time.time() + 60)  # waited for all along
        start = time.time()
        for index in range(500):  # a call per slot, each answered at once
            call = Call()
            deadlines.watch(call, start + 61 + index * RESOLUTION).discard(call)
        return len(deadlines), 500

    kept, made = run(scenario)
    assert kept <= 8 < made
