"""The scheduler's batch mode (``--max-batch-size``) with fake processes, on a real event loop:
when a batch goes, and to which slot (Triton's rule, issue 30)."""

from __future__ import annotations

from abeja_runtime.frames import Call, RunBatch
from abeja_runtime.front.pending import PendingCall

from .fakes import FakePool, FakeProcess
from .test_pool import pending, run


def busy(**settings: object) -> tuple[FakePool, FakeProcess, PendingCall]:
    """A pool of one ready process, running a first batch of one call."""
    fake = FakePool(**settings)
    (process,) = fake.made
    process.ready()
    first = pending(fake)
    fake.pool.submit(first)
    return fake, process, first


def runs(process: FakeProcess) -> list[tuple[int, ...]]:
    """The batches sent to ``process``, in order."""
    return [frame.ids for frame in process.frames if isinstance(frame, RunBatch)]


def ids(*calls: PendingCall) -> tuple[int, ...]:
    return tuple(call.frame.id for call in calls)


def test_an_idle_process_takes_a_lone_call_at_once_and_what_gathered_when_it_frees() -> None:
    async def scenario() -> None:
        fake, process, first = busy(max_batch_size=4, max_batch_wait=60.0)
        assert runs(process) == [ids(first)]  # no wait for the batch to fill
        behind = [pending(fake) for _ in range(5)]
        for call in behind:
            fake.pool.submit(call)
        assert runs(process) == [ids(first)]  # busy, one slot: they gather
        assert fake.pool.queued == 5
        process.answer(first.frame.id)
        assert runs(process)[1:] == [ids(*behind[:4])]  # as many as a batch holds, at once
        for call in behind[:4]:
            process.answer(call.frame.id)
        assert runs(process)[2:] == [ids(behind[4])]
        assert all(isinstance(frame, Call | RunBatch) for frame in process.frames)

    run(scenario)


def test_a_full_batch_goes_to_a_free_slot_at_once() -> None:
    async def scenario() -> None:
        fake, process, first = busy(max_batch_size=2, max_batch_wait=60.0, concurrency=2)
        one, two = pending(fake), pending(fake)
        fake.pool.submit(one)
        assert runs(process) == [ids(first)]  # one of two: it gathers (a minute at most)
        fake.pool.submit(two)
        assert runs(process) == [ids(first), ids(one, two)]
        assert fake.pool.running(one) and fake.pool.queued == 0

    run(scenario)


def test_a_batch_goes_to_a_free_slot_once_its_first_call_has_waited() -> None:
    async def scenario() -> None:
        fake, process, _ = busy(max_batch_size=8, max_batch_wait=0.05, concurrency=2)
        waiting = pending(fake)
        fake.pool.submit(waiting)
        assert len(runs(process)) == 1
        fake.clock.advance(0.04)
        fake.pool.scheduler.dispatch()  # (what its timer does)
        assert len(runs(process)) == 1  # it gathers on, short of its wait
        fake.clock.advance(0.01)
        fake.pool.scheduler.dispatch()
        assert runs(process)[1] == ids(waiting)

    run(scenario)


def test_a_withdrawn_call_leaves_the_batch_that_gathers() -> None:
    async def scenario() -> None:
        fake, process, first = busy(max_batch_size=4, max_batch_wait=60.0)
        gone, stays = pending(fake), pending(fake)
        fake.pool.submit(gone)
        fake.pool.submit(stays)
        fake.pool.withdraw(gone)
        process.answer(first.frame.id)
        assert runs(process)[1:] == [ids(stays)]
        assert fake.pool.scheduler.admitted == 1

    run(scenario)
