"""The one queue in front of the handler processes, and where each call goes (:class:`Scheduler`).

Every call is a :class:`~abeja_runtime.front.pending.PendingCall`. It goes at once to a ready
process with a free slot, or waits in the one queue that all processes take from, so that no
call waits behind a slow one while another process is idle; admission bounds the calls in the
pool (``503 service busy`` beyond). A process runs its calls in the order they came, up to
``concurrency``, and holds up to :data:`PIPELINE` more in its socket while its calls are quick;
once its oldest has run :data:`_PIPELINE_WHILE_YOUNGER`, the front takes back those waiting
behind it. With ``--max-batch-size``, the queue goes out in batches (``batching.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Mapping
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.errors import (
    CallerDeadlinePassed,
    DeadlineTooNear,
    HttpError,
    NotStartedInTime,
    ServiceBusy,
    WorkerCrashed,
)
from abeja_runtime.frames import Cancel, GiveBack, RunBatch
from abeja_runtime.front.batching import BatchRule
from abeja_runtime.front.call_time import CallTime
from abeja_runtime.front.pending import STREAM_LOST, Batch, Member, PendingCall, ProcessState
from abeja_runtime.front.tenants import PRIORITIES
from abeja_runtime.front.waiting import ArrivalOrder, FairOrder, Waiting
from abeja_runtime.metrics import FrontMetrics

__all__ = ["PIPELINE", "Scheduler"]

#: Calls a process may hold beyond its concurrency, waiting in its socket, while its calls are
#: quick (the oldest younger than :data:`_PIPELINE_WHILE_YOUNGER`): it takes the next one
#: without waiting for the front, and the front hands over a loop iteration's requests at once.
PIPELINE: Final = 16
_PIPELINE_WHILE_YOUNGER: Final = 0.05
#: Calls are quick while a process is busy for less than this per call, on average
#: (:attr:`Scheduler.call_time`). Quick calls go to a process that is already serving
#: rather than wake an idle one: waking a process costs more than the call.
_QUICK_CALL: Final = 0.0002
#: ... but only while that process's oldest call is younger than this: a call that turns out
#: slow holds up what joined it in its first milliseconds only.
_JOIN_WHILE_YOUNGER: Final = 0.002


class Scheduler:
    """The queue, placement and give-back over ``members`` (the lifecycle's list)."""

    def __init__(
        self,
        config: Config,
        members: list[Member],
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float],
    ) -> None:
        self._concurrency = config.concurrency
        self._members = members
        self._loop = loop
        self._clock = clock
        self._queue: Waiting = ArrivalOrder()
        self._turn = 0  # where the next search for a free process starts
        #: How long a process is busy with a call, as the front sees it.
        self.call_time = CallTime()
        #: Calls admitted and not finished (queued, sent, or running past their deadline).
        self.admitted = 0
        self._capacity = config.workers * (config.concurrency + config.max_queue)
        #: The places in the queue beyond the slots, which tenants share by weight.
        self._places = config.workers * config.max_queue
        self.metrics: FrontMetrics | None = None
        #: Answers a call taken out of the queue too late (504 for its deadline, or the error
        #: given): the call service's.
        self.expired: Callable[[PendingCall, HttpError | None], None] = lambda *_: None
        self._slots = config.workers * config.concurrency
        #: Calls a process may hold, running or waiting in its socket (:data:`PIPELINE`).
        self._most_held = config.concurrency + PIPELINE
        #: Batch mode (``--max-batch-size`` above 1, or declared by the handler).
        self.batching: BatchRule | None = None
        if config.max_batch_size > 1:
            self.batch_by(config.max_batch_size, config.max_batch_wait)

    def order_by(self, weights: Mapping[str, float], aging: float) -> None:
        """From now on (before any call), waiting calls are served by priority class and by
        weighted fairness across tenants (``waiting.py``)."""
        self._queue = FairOrder(weights, len(PRIORITIES), aging)
        self._most_held = self._concurrency  # no pipelining: one sent early would go first

    def batch_by(self, size: int, wait: float) -> None:
        """From now on, the queue goes out in batches (the handler declared it batched)."""
        self.batching = BatchRule(size, wait, self._loop, self.dispatch)
        if self.metrics is not None:
            self.metrics.batching()  # registered (at 0) from now
        now = self._clock()
        for pending in self._queue:  # queued before the mode was known: from now
            pending.queued_at = now

    # -- admission ----------------------------------------------------------------------------

    def submit(self, pending: PendingCall) -> None:
        """Send ``pending`` to a free slot, or queue it; ``ServiceBusy`` when the pool is full."""
        full, queue = self.admitted >= self._capacity, self._queue
        if type(queue) is FairOrder:  # the call whose place it takes, if any, gets a 503
            if (taken := queue.room_for(pending, self._places, full=full)) is not None:
                taken.abandon()
                self._fail(taken, ServiceBusy(), self._clock())
        elif full:
            raise ServiceBusy()
        self.admitted += 1
        pending.queued_at = self._clock()
        queue.append(pending)
        self.dispatch()

    def turns_away(self, tenant: str, priority: int) -> bool:
        """Whether :meth:`submit` would refuse a call of ``tenant`` in class ``priority`` now."""
        full, queue = self.admitted >= self._capacity, self._queue
        if type(queue) is FairOrder:
            return queue.turns_away(tenant, priority, self._places, full=full)
        return full

    def admit_before(self, deadline: float, budget: float, tenant: str, priority: int) -> None:
        """A call of ``tenant`` in class ``priority`` whose caller gave it ``budget`` seconds, to
        ``deadline``: :class:`CallerDeadlinePassed` when they passed already,
        :class:`DeadlineTooNear` when it would be answered after them, waiting (while no slot is
        free) for the calls that go before it; none is refused while the estimate is not
        trusted."""
        left = deadline - time.time()
        if left <= 0:
            raise CallerDeadlinePassed(budget)
        if not self.call_time.trusted(self.admitted, self._clock()):
            return
        ahead = None
        if self.admitted >= self._slots:
            queue = self._queue
            ahead = (
                queue.ahead_of(tenant, priority)
                if type(queue) is FairOrder
                else self.admitted - self._slots
            )
        if (expected := self.call_time.expected(ahead, self._slots)) > left:
            raise DeadlineTooNear(expected, left)

    def start_by(self, deadline: float) -> float:
        """The latest a call due by ``deadline`` may start, while the estimate is trusted: earlier
        by :meth:`CallTime.bound`; a call with less time left is answered ``504`` then (here, or
        in its handler process), rather than begun for nobody."""
        trusted = self.call_time.trusted(self.admitted, self._clock())
        return deadline - self.call_time.bound() if trusted else deadline

    def free_places(self) -> int:
        """Calls that may still be admitted before the queue is full."""
        return self._capacity - self.admitted

    @property
    def queued(self) -> int:
        """Calls admitted and not running (queued, or waiting in a process's socket): the gauge."""
        running = sum(min(len(member.sent), self.calls_running(member)) for member in self._members)
        return max(0, self.admitted - running)

    def calls_running(self, member: Member) -> int:
        """How many of the calls sent to ``member`` it runs (the first ones; the others wait
        in its socket): all of them in batch mode, as a batch goes only to a free slot."""
        return len(member.sent) if self.batching is not None else self._concurrency

    def running(self, pending: PendingCall) -> bool:
        """Whether ``pending`` runs in its process now."""
        member = pending.member
        return member is not None and (
            self.batching is not None
            or pending.frame.id in itertools.islice(member.sent, self._concurrency)
        )

    def withdraw(self, pending: PendingCall) -> None:
        """The caller gave up (deadline, client gone), once: a queued call never runs; a sent
        one's answer is dropped when it comes."""
        if pending.abandoned:
            return
        pending.abandon()
        if pending.member is not None:
            pending.member.send(Cancel(pending.frame.id))
        else:
            with contextlib.suppress(ValueError):
                self._queue.remove(pending)
                self._release(pending, self._clock())

    # -- placement ----------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Send what the queue holds to the slots that are free."""
        if self.batching is not None:
            self._send_batches(self.batching)
            return
        queue = self._queue
        if not queue:
            return
        now, wall = self._clock(), time.time()
        while queue and (member := self._free_member(now)) is not None:
            pending = queue.popleft()
            if 0 < pending.frame.start_by <= wall:  # it could not answer in time: never sent
                self._expire(pending, now, NotStartedInTime())
                continue
            self._send(member, pending, now)

    def _free_member(self, now: float) -> Member | None:
        """Where the next call goes: while calls are quick, a serving process whose oldest call
        is young (:data:`_QUICK_CALL`); else the ready process with the fewest calls (ties go
        round, so that each stays warm) with a free slot, or room in its pipeline while its
        oldest call is young."""
        members = self._members
        most_held = self._most_held
        if self.call_time.mean < _QUICK_CALL:
            for member in members:
                serving = member.state is ProcessState.READY and 0 < len(member.sent) < most_held
                if serving and member.oldest_call_age(now) < _JOIN_WHILE_YOUNGER:
                    return member
        count = len(members)
        best: Member | None = None
        start = self._turn
        for offset in range(count):
            member = members[(start + offset) % count]
            ready = member.state is ProcessState.READY
            if ready and (best is None or len(member.sent) < len(best.sent)):
                best = member
                if not member.sent:
                    break
        self._turn = (start + 1) % count if count else 0
        if best is None or len(best.sent) < self._concurrency:
            return best
        if len(best.sent) < most_held and best.oldest_call_age(now) < _PIPELINE_WHILE_YOUNGER:
            return best
        return None

    def _send(self, member: Member, pending: PendingCall, now: float) -> None:
        pending.member = member
        pending.sent_at = now
        pending.giving_back = False
        member.sent[pending.frame.id] = pending
        waits = self.batching is None and len(member.sent) > self._concurrency
        if not waits:
            self._started(pending, now)
        member.send_call(pending)
        if waits and member.take_back_timer is None:
            self._look_for_slow_call(member)

    def _send_batches(self, rule: BatchRule) -> None:
        queue = self._queue
        while self._expire_passed(queue) and (
            batch := rule.next_batch(queue, self._members, self._concurrency, self._clock())
        ):
            member, size, reason = batch
            left = Batch(size)
            now = self._clock()
            calls = [queue.popleft() for _ in range(size)]
            for pending in calls:
                pending.batch = left
                self._send(member, pending, now)
            member.send(RunBatch(tuple(pending.frame.id for pending in calls)))
            member.batches += 1
            if self.metrics is not None:
                waits = [now - pending.queued_at for pending in calls]
                self.metrics.batching().released(size, reason, waits)

    def _expire_passed(self, queue: Waiting) -> bool:
        """Take the expired calls out of ``queue`` (none goes in a batch); whether any is left."""
        wall = time.time()
        for pending in [pending for pending in queue if pending.deadline <= wall]:
            queue.remove(pending)
            self._expire(pending, self._clock())
        return bool(queue)

    def _expire(self, pending: PendingCall, now: float, exc: HttpError | None = None) -> None:
        """``pending``, taken out of the queue too late, leaves the pool, answered by
        :attr:`expired`."""
        pending.abandon()
        self._release(pending, now)
        self.expired(pending, exc)

    def _started(self, pending: PendingCall, now: float) -> None:
        """``pending``'s wait in the queue ends now (its handler call starts, or it is given up):
        observed once, however often it is requeued."""
        if pending.waited:
            return
        pending.waited = True
        if self.metrics is not None:
            self.metrics.queue_waited(now - pending.queued_at)
        if pending.trace is not None:
            pending.trace.queue_wait(now - pending.queued_at)

    def _release(self, pending: PendingCall, now: float) -> None:
        """``pending`` leaves the pool (answered, failed, or given up)."""
        self.admitted -= 1
        self._started(pending, now)
        pending.returned()
        pending.finish()

    def _fail(self, pending: PendingCall, exc: HttpError, now: float) -> None:
        """``pending`` leaves the pool with ``exc`` for its answer, unless it has one."""
        self._release(pending, now)
        if not pending.answer.done():
            pending.answer.set_exception(exc)

    # -- give-back ----------------------------------------------------------------------------

    def _look_for_slow_call(self, member: Member) -> None:
        """Once ``member``'s oldest call is :data:`_PIPELINE_WHILE_YOUNGER` old, the calls
        waiting behind the ones it runs are taken back for the queue (:class:`GiveBack`)."""
        member.take_back_timer = None
        concurrency = self._concurrency
        if len(member.sent) <= concurrency or member.state is not ProcessState.READY:
            return  # (not READY: it stops, and its calls stay where they are)
        age = member.oldest_call_age(self._clock())
        if age < _PIPELINE_WHILE_YOUNGER:
            member.take_back_timer = self._loop.call_later(
                _PIPELINE_WHILE_YOUNGER - age, self._look_for_slow_call, member
            )
            return
        for pending in itertools.islice(member.sent.values(), concurrency, None):
            if not pending.giving_back and not pending.abandoned:
                pending.giving_back = True
                member.send(GiveBack(pending.frame.id))

    def given_back(self, member: Member, call_id: int) -> None:
        """``member`` did not run the call: back to the queue (or gone, if nobody waits for it
        any more)."""
        pending = member.sent.pop(call_id, None)
        if pending is None:
            return
        _left_batch(member, pending)
        pending.returned(to_queue=True)
        if pending.abandoned:
            self._release(pending, self._clock())  # given up while it waited there
        else:
            self._queue.put_back(pending)
        self.dispatch()

    # -- ends ---------------------------------------------------------------------------------

    def settle(self, member: Member, pending: PendingCall) -> None:
        """``member`` answered ``pending`` whole (or ended its stream): its slot goes to the
        next call."""
        del member.sent[pending.frame.id]
        now = self._clock()
        if pending.batch is not None:
            _left_batch(member, pending)
        elif len(member.sent) >= self._concurrency:  # the next one sent there starts
            following = next(itertools.islice(member.sent.values(), self._concurrency - 1, None))
            if not following.giving_back:  # (given back: it waits on)
                self._started(following, now)
        busy = now - max(pending.sent_at, member.answered_at)
        member.answered_at = now
        self.call_time.add(busy, now)
        self._release(pending, now)
        self.dispatch()

    def fail_queue(self, exc: HttpError) -> None:
        """Every queued call fails with ``exc`` (no process will take them soon)."""
        now = self._clock()
        for pending in list(self._queue):
            self._queue.remove(pending)
            self._fail(pending, exc, now)

    def fail_or_requeue(self, member: Member, how: str) -> None:
        """``member`` exited (``how``): the calls it was running fail, the ones that had not
        started go back to the head of the queue."""
        running = self.calls_running(member)
        requeue: list[PendingCall] = []
        now = self._clock()
        for index, pending in enumerate(member.sent.values()):
            if index < running or pending.answer.done() or pending.abandoned:
                if pending.answer.done() and pending.chunks is not None:
                    pending.end_stream(STREAM_LOST)
                self._fail(pending, WorkerCrashed(how), now)
            else:
                pending.returned(to_queue=True)
                requeue.append(pending)
        member.sent.clear()
        for pending in requeue:
            self._queue.put_back(pending)
        self.dispatch()


def _left_batch(member: Member, pending: PendingCall) -> None:
    """``pending`` is out of its batch, if it has one: the batch's slot in ``member`` is free
    once none of its calls is left."""
    batch, pending.batch = pending.batch, None
    if batch is not None:
        batch.left -= 1
        if not batch.left:
            member.batches -= 1
