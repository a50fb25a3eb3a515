"""The front's bound on bodies held at once, on its own loop: turns in arrival order, and a
place never lost to a waiter that gave up (its deadline, its client gone)."""

from __future__ import annotations

import asyncio

import pytest

from abeja_runtime.front.body import BodyGate


async def settle() -> None:
    """Let every ready task run (a few loop iterations; nothing here sleeps)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def waiter(gate: BodyGate, entered: list[str], name: str) -> None:
    await gate.enter()
    entered.append(name)


def test_bodies_beyond_the_places_wait_their_turn_in_order() -> None:
    async def scenario() -> list[str]:
        gate = BodyGate(1, asyncio.get_running_loop())
        await gate.enter()
        entered: list[str] = []
        tasks = [asyncio.create_task(waiter(gate, entered, name)) for name in "abc"]
        await settle()
        assert entered == [] and gate.waiting == 3
        for _ in "abc":
            gate.leave()
            await settle()
        await asyncio.gather(*tasks)
        return entered

    assert asyncio.run(scenario()) == ["a", "b", "c"]


def test_a_waiter_that_gives_up_holds_nothing() -> None:
    async def scenario() -> None:
        gate = BodyGate(1, asyncio.get_running_loop())
        await gate.enter()
        gone = asyncio.create_task(gate.enter())
        await settle()
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert gate.waiting == 0
        gate.leave()
        assert gate.has_place()

    asyncio.run(scenario())


def test_a_place_given_as_its_waiter_gave_up_goes_to_the_next() -> None:
    async def scenario() -> list[str]:
        gate = BodyGate(1, asyncio.get_running_loop())
        await gate.enter()
        entered: list[str] = []
        gone = asyncio.create_task(waiter(gate, entered, "gone"))
        after = asyncio.create_task(waiter(gate, entered, "after"))
        await settle()
        gate.leave()  # the place is given to "gone"...
        gone.cancel()  # ...which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await gone
        await asyncio.wait_for(after, 5)
        assert not gate.has_place()  # "after" holds the one place
        gate.leave()
        assert gate.has_place()
        return entered

    assert asyncio.run(scenario()) == ["after"]
