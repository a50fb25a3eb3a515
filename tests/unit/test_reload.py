"""A reload's sequence (``front/reload.py``) with fake processes, on a real event loop: one
worker replaced at a time, every worker of the old version replaced (one starting at the signal
too), and a new version that fails leaving the old one serving, or replaced if it died."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from abeja_runtime.front.pending import ProcessState

from .fakes import FakePool


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


class Counted:
    """The lifecycle's metrics seen as the restarts it counts (its other events ignored)."""

    def __init__(self) -> None:
        self.restarts: list[str] = []

    def worker_restarted(self, reason: str) -> None:
        self.restarts.append(reason)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def counted(fake: FakePool) -> Counted:
    fake.pool.lifecycle.metrics = metrics = Counted()  # type: ignore[assignment]
    return metrics


def states(fake: FakePool) -> list[tuple[int, ProcessState]]:
    return [(member.pid, member.state) for member in fake.pool.lifecycle.members]


def test_workers_are_replaced_one_at_a_time_until_all_are_new() -> None:
    async def scenario() -> None:
        fake = FakePool(workers=2)
        metrics = counted(fake)
        old = list(fake.made)
        for process in old:
            process.ready()
        fake.pool.lifecycle.reload()

        assert len(fake.made) == 3  # one replacement at a time
        assert metrics.restarts == []  # counted as each is replaced, not as its replacement starts
        fake.made[2].ready()
        assert old[0].closed  # the first old one finishes (it had no call)
        assert len(fake.made) == 4  # then the next one's replacement
        old[0].exit(0)
        fake.made[3].ready()
        assert old[1].closed
        old[1].exit(0)
        assert fake.pool.lifecycle._reload is None  # done
        assert [pid for pid, _ in states(fake)] == [fake.made[2].pid, fake.made[3].pid]
        assert metrics.restarts == ["reload", "reload"]

    run(scenario)


def test_a_worker_starting_at_the_signal_is_replaced_once_it_is_ready() -> None:
    async def scenario() -> None:
        fake = FakePool(workers=2)
        fake.made[0].ready()  # the second one still starts, of the old version
        fake.pool.lifecycle.reload()
        fake.made[2].ready()  # the first one's replacement
        fake.made[0].exit(0)
        assert fake.pool.lifecycle._reload is not None  # the old one starting is not forgotten
        fake.made[1].ready()
        assert len(fake.made) == 4  # ... it is replaced in turn
        fake.made[3].ready()
        fake.made[1].exit(0)
        assert fake.pool.lifecycle._reload is None

    run(scenario)


def test_a_new_version_that_fails_leaves_the_old_one_serving_and_unreplaced() -> None:
    async def scenario() -> None:
        fake = FakePool(workers=1)
        metrics = counted(fake)
        (old,) = fake.made
        old.ready()
        fake.pool.lifecycle.reload()
        new = fake.made[1]
        new.exit(75)  # its warm-up failed
        await asyncio.sleep(0)
        assert len(fake.made) == 2  # no replacement of the failed one
        assert states(fake) == [(old.pid, ProcessState.READY)]
        assert not fake.pool.lifecycle.members[0].retiring  # it may be retired later
        assert fake.pool.lifecycle._reload is None
        assert metrics.restarts == []  # no worker was replaced

    run(scenario)


def test_a_failed_new_version_whose_old_worker_died_is_replaced_by_the_old_version() -> None:
    async def scenario() -> None:
        fake = FakePool(workers=1)
        (old,) = fake.made
        old.ready()
        fake.pool.lifecycle.reload()
        old.exit(-9)  # killed while its replacement starts: that one stands for it
        assert len(fake.made) == 2
        fake.made[1].exit(75)  # ... and fails: the pool must not be left without a worker
        assert len(fake.made) == 3
        replacement = fake.pool.lifecycle.members[0]
        assert replacement.launcher is fake.pool.lifecycle.launcher  # the old version's

    run(scenario)
