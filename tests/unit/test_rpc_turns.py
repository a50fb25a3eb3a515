"""The gRPC port reads a connection's messages one at a time, and never makes a connection wait
for another (``front/rpc.py``): its turns on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("grpc")
from abeja_runtime.front.rpc import _ConnectionTurns

ONE = "ipv4:127.0.0.1:40001"
OTHER = "ipv4:127.0.0.1:40002"


def test_a_connection_waits_for_its_own_message_being_read_not_for_another_connection() -> None:
    async def scenario() -> list[str]:
        turns = _ConnectionTurns()
        steps: list[str] = []
        reading, read = asyncio.Event(), asyncio.Event()

        async def receive(connection: str, name: str, until: asyncio.Event | None = None) -> None:
            async with turns.turn(connection):
                steps.append(f"{name} read")
                if until is not None:
                    reading.set()
                    await until.wait()
                steps.append(f"{name} done")

        first = asyncio.create_task(receive(ONE, "first", until=read))
        await reading.wait()
        second = asyncio.create_task(receive(ONE, "second"))
        await receive(OTHER, "other")  # not held up by the first connection's message
        read.set()
        await asyncio.gather(first, second)
        assert not turns._turns, "nothing is kept for connections without a call"
        return steps

    steps = asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert steps == [
        "first read",
        "other read",
        "other done",
        "first done",
        "second read",
        "second done",
    ]
