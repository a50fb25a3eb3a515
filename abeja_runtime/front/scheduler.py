"""The one queue in front of the handler processes, and where each call goes (:class:`Scheduler`).

Every call (an HTTP request's, a gRPC call's) is a :class:`~abeja_runtime.front.pending.
PendingCall`. It goes at once to a ready process with a free slot, or waits in the one queue
that all processes take from, so that no call waits behind a slow one while another process is
idle; admission bounds the calls in the pool (``503 service busy`` beyond). A process has
``concurrency`` slots plus :data:`PIPELINE`: with one more call already in its socket, a ``def``
handler starts its next call without waiting for the front. While calls are quick, a call joins
a process that is serving rather than wake an idle one; once a process's call has run
:data:`_PIPELINE_WHILE_YOUNGER`, the front takes back the calls waiting behind it. With
``--max-batch-size``, the queue goes out in batches by :class:`~abeja_runtime.front.batching.
BatchRule`.

A process that exits fails only the calls it was running (the first ``concurrency`` of those it
was sent and had not answered, in order: a process takes calls in the order they came); the
others go back to the head of the queue (:meth:`Scheduler.fail_or_requeue`).

The scheduler knows the processes only as the pool's :class:`~abeja_runtime.front.members.
Member` records, and time only through its ``clock``: the unit tests give it fakes of both.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from abeja_runtime.config import Config
from abeja_runtime.errors import HttpError, ServiceBusy, WorkerCrashed
from abeja_runtime.frames import Cancel, GiveBack, RunBatch
from abeja_runtime.front.batching import BatchRule
from abeja_runtime.front.members import Member, ProcessState
from abeja_runtime.front.pending import STREAM_LOST, Batch, PendingCall
from abeja_runtime.metrics import FrontMetrics

__all__ = ["PIPELINE", "Scheduler"]

#: Calls a process may hold beyond its concurrency, waiting in its socket, while its calls are
#: quick (the oldest younger than :data:`_PIPELINE_WHILE_YOUNGER`): it takes the next one
#: without waiting for the front, and the front hands over a loop iteration's requests at once.
PIPELINE: Final = 16
_PIPELINE_WHILE_YOUNGER: Final = 0.05
#: Calls are quick while a process is busy for less than this per call, on average
#: (:attr:`Scheduler.call_seconds`). Quick calls go to a process that is already serving
#: rather than wake an idle one: waking a process costs more than the call.
_QUICK_CALL: Final = 0.0002
#: ... but only while that process's oldest call is younger than this: a call that turns out
#: slow holds up what joined it in its first milliseconds only.
_JOIN_WHILE_YOUNGER: Final = 0.002
#: The weight of the last call in the running mean of :attr:`Scheduler.call_seconds`.
_CALL_SECONDS_WEIGHT: Final = 0.1


class Scheduler:
    """The queue, placement and give-back over ``members`` (the lifecycle's list)."""

    def __init__(
        self,
        config: Config,
        members: list[Member],
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._concurrency = config.concurrency
        self._members = members
        self._loop = loop
        self._clock = clock
        self._queue: deque[PendingCall] = deque()
        self._turn = 0  # where the next search for a free process starts
        #: The running mean of how long a process is busy with a call (from when the call was
        #: sent, or its previous answer came, to its answer), as the front sees it.
        self.call_seconds = 1.0
        #: Calls admitted and not finished (queued, sent, or running past their deadline).
        self.admitted = 0
        self._capacity = config.workers * (config.concurrency + config.max_queue)
        self.metrics: FrontMetrics | None = None
        #: Batch mode (``--max-batch-size`` above 1, or declared by the handler).
        self.batching: BatchRule | None = None
        if config.max_batch_size > 1:
            self.batch_by(config.max_batch_size, config.max_batch_wait)
        #: The pool stops: calls waiting behind a slow one stay where they are.
        self.stopping = False

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
        if self.admitted >= self._capacity:
            raise ServiceBusy()
        self.admitted += 1
        pending.queued_at = now = self._clock()
        if self.batching is not None:
            self._queue.append(pending)
            self._send_batches(self.batching)
            return
        member = self._free_member(now)
        if member is None:
            self._queue.append(pending)
        else:
            self._send(member, pending, now)

    def free_places(self) -> int:
        """Calls that may still be admitted before the queue is full."""
        return self._capacity - self.admitted

    @property
    def queued(self) -> int:
        """Calls admitted and not running (in the queue, or in a process's socket behind the
        calls it runs), for the queued gauge."""
        members = self._members
        if self.batching is not None:
            return max(0, self.admitted - sum(len(member.sent) for member in members))
        running = sum(min(len(member.sent), self._concurrency) for member in members)
        return max(0, self.admitted - running)

    def running(self, pending: PendingCall) -> bool:
        """Whether ``pending`` runs in its process now: one of the first ``concurrency`` calls
        it was sent (the others wait in its socket, as in the queue); a batch's, always."""
        member = pending.member
        if member is None:
            return False
        if self.batching is not None:
            return True
        for index, call_id in enumerate(member.sent):
            if index >= self._concurrency:
                return False
            if call_id == pending.frame.id:
                return True
        return False

    def withdraw(self, pending: PendingCall) -> None:
        """The caller gave up (deadline, client gone): a queued call never runs; a sent one's
        answer is dropped when it comes. Once: a call withdrawn already is left as it is."""
        if pending.abandoned:
            return
        pending.abandon()
        if pending.member is not None:
            pending.member.send(Cancel(pending.frame.id))
        else:
            with contextlib.suppress(ValueError):
                self._queue.remove(pending)
                self.admitted -= 1
                self._started(pending, self._clock())  # its wait ends here
                pending.finish()

    # -- placement ----------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Send what the queue holds to the slots that are free."""
        if self.batching is not None:
            self._send_batches(self.batching)
            return
        queue = self._queue
        if not queue:
            return
        now = self._clock()
        while queue:
            member = self._free_member(now)
            if member is None:
                return
            self._send(member, queue.popleft(), now)

    def _free_member(self, now: float) -> Member | None:
        """Where the next call goes.

        While calls are quick, a process that is serving and whose oldest call is young takes
        it, up to its pipeline (see :data:`_QUICK_CALL`). Otherwise the ready process with the
        fewest calls (ties go round the processes, so that each keeps serving and stays warm)
        when it has a free slot; else, pipelined, one whose calls are quick. A call never waits
        in a process behind a slow one: it waits in the queue, for whichever process frees a
        slot first."""
        if self.call_seconds < _QUICK_CALL:
            serving = self._serving_young(now)
            if serving is not None:
                return serving
        members = self._members
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
        if best is None:
            return None
        held = len(best.sent)
        if held < self._concurrency:
            return best
        if held < self._concurrency + PIPELINE:
            age = best.oldest_call_age(now)
            if age is not None and age < _PIPELINE_WHILE_YOUNGER:
                return best
        return None

    def _serving_young(self, now: float) -> Member | None:
        """A ready process that serves calls, the oldest of them younger than
        :data:`_JOIN_WHILE_YOUNGER`, with room in its pipeline (for a quick call to join)."""
        most_held = self._concurrency + PIPELINE
        for member in self._members:
            if member.state is ProcessState.READY and 0 < len(member.sent) < most_held:
                age = member.oldest_call_age(now)
                if age is not None and age < _JOIN_WHILE_YOUNGER:
                    return member
        return None

    def _send(self, member: Member, pending: PendingCall, now: float) -> None:
        pending.member = member
        pending.sent_at = now
        pending.giving_back = False
        member.sent[pending.frame.id] = pending
        # Else it waits there (see settle).
        if not pending.waited and len(member.sent) <= self._concurrency:
            self._started(pending, now)
        member.send(pending.frame, pending.fd)
        if len(member.sent) > self._concurrency and member.take_back_timer is None:
            self._look_for_slow_call(member)

    def _send_batches(self, rule: BatchRule) -> None:
        queue = self._queue
        while batch := rule.next_batch(queue, self._members, self._concurrency, self._clock()):
            member, size, reason = batch
            left = Batch(size)
            now = self._clock()
            calls = [queue.popleft() for _ in range(size)]
            for pending in calls:
                pending.batch = left
                pending.member = member
                self._started(pending, now)
                pending.sent_at = now
                member.sent[pending.frame.id] = pending
                member.send(pending.frame, pending.fd)
            member.send(RunBatch(tuple(pending.frame.id for pending in calls)))
            member.batches += 1
            if self.metrics is not None:
                waits = [now - pending.queued_at for pending in calls]
                self.metrics.batching().released(size, reason, waits)

    def _started(self, pending: PendingCall, now: float) -> None:
        """``pending``'s handler call starts now, or it is given up in the queue (its
        deadline, its client gone): its wait is observed (the queue-wait histogram, its
        span). Once a call: one given back, or whose process died, is not counted again."""
        if pending.waited:
            return
        pending.waited = True
        if self.metrics is not None:
            self.metrics.queue_waited(now - pending.queued_at)
        if pending.trace is not None:
            pending.trace.queue_wait(now - pending.queued_at)

    # -- give-back ----------------------------------------------------------------------------

    def _look_for_slow_call(self, member: Member) -> None:
        """Calls wait in ``member`` behind the ones it runs: once its oldest call is
        :data:`_PIPELINE_WHILE_YOUNGER` old, it is slow, and the calls behind it are taken
        back (:class:`GiveBack`) for the queue, where any process that frees a slot takes them.
        Looked at again while calls wait there."""
        member.take_back_timer = None
        calls = list(member.sent.values())
        concurrency = self._concurrency
        if len(calls) <= concurrency or self.stopping or member.state is not ProcessState.READY:
            return
        age = self._clock() - calls[0].sent_at
        if age < _PIPELINE_WHILE_YOUNGER:
            member.take_back_timer = self._loop.call_later(
                _PIPELINE_WHILE_YOUNGER - age, self._look_for_slow_call, member
            )
            return
        for pending in calls[concurrency:]:
            if not pending.giving_back and not pending.abandoned:
                pending.giving_back = True
                member.send(GiveBack(pending.frame.id))

    def given_back(self, member: Member, call_id: int) -> None:
        """``member`` did not run the call: to the queue, in the order the calls came (or
        gone, if nobody waits for it any more)."""
        pending = member.sent.pop(call_id, None)
        if pending is None:
            return
        if pending.batch is not None:
            _left_batch(member, pending)
        pending.member = None
        if pending.abandoned:
            self.admitted -= 1
            self._started(pending, self._clock())  # given up while it waited there
            pending.finish()
        else:
            queue = self._queue
            index = 0
            while index < len(queue) and queue[index].frame.id < call_id:
                index += 1
            queue.insert(index, pending)

    # -- ends ---------------------------------------------------------------------------------

    def settle(self, member: Member, pending: PendingCall) -> None:
        """``member`` answered ``pending`` whole (or ended its stream): it leaves the pool."""
        del member.sent[pending.frame.id]
        now = self._clock()
        if not pending.waited:  # answered, yet taken for waiting (a GiveBack's race): up to now
            self._started(pending, now)
        if pending.batch is not None:
            _left_batch(member, pending)
        elif len(member.sent) >= self._concurrency:  # the next one sent there starts
            concurrency = self._concurrency
            following = (
                next(iter(member.sent.values()))
                if concurrency == 1
                else next(itertools.islice(member.sent.values(), concurrency - 1, None))
            )
            if not following.waited and not following.giving_back:  # (given back: it waits on)
                self._started(following, now)
        busy = now - max(pending.sent_at, member.answered_at)
        member.answered_at = now
        self.call_seconds += _CALL_SECONDS_WEIGHT * (busy - self.call_seconds)
        pending.finish()
        self.admitted -= 1

    def fail_queue(self, exc: HttpError) -> None:
        """Every queued call fails with ``exc`` (no process will take them soon)."""
        queue, self._queue = self._queue, deque()
        now = self._clock()
        for pending in queue:
            self.admitted -= 1
            self._started(pending, now)  # given up in the queue
            pending.finish()
            if not pending.answer.done():
                pending.answer.set_exception(exc)

    def fail_or_requeue(self, member: Member, how: str) -> None:
        """``member`` exited (``how``): the calls it was running fail, the ones that had not
        started go back to the head of the queue."""
        # A batch is sent to a free slot: all of a batch process's calls were running.
        running = len(member.sent) if self.batching is not None else self._concurrency
        requeue: list[PendingCall] = []
        now = self._clock()
        for index, pending in enumerate(member.sent.values()):
            if index < running or pending.answer.done() or pending.abandoned:
                self.admitted -= 1
                self._started(pending, now)  # if it still waited there, its wait ends
                pending.finish()
                if not pending.answer.done():
                    pending.answer.set_exception(WorkerCrashed(how))
                elif pending.chunks is not None:
                    pending.chunks.put_nowait(STREAM_LOST)
            else:
                pending.member = None
                requeue.append(pending)
        member.sent.clear()
        self._queue.extendleft(reversed(requeue))


def _left_batch(member: Member, pending: PendingCall) -> None:
    """``pending`` is out of its batch (answered, given back): the batch's slot in ``member``
    is free once none of its calls is left."""
    assert pending.batch is not None
    pending.batch.left -= 1
    if not pending.batch.left:
        member.batches -= 1
    pending.batch = None
