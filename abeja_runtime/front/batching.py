"""Request batching's rule (``--max-batch-size``): which batch goes where now (:class:`BatchRule`).

Triton's rule rather than a fixed window. A process that runs nothing takes what waits at once
(a lone request pays no wait); while every process runs a batch, calls gather, and a batch goes
to a free slot once it is full or its first call has waited ``--max-batch-wait`` (from that
call's arrival, never moved by the calls that join it); with no free slot, until a slot frees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from abeja_runtime.front.pending import Member, ProcessState
from abeja_runtime.front.waiting import Waiting

__all__ = ["BatchRule"]


class BatchRule:
    """Batches of up to ``size`` calls, gathering ``wait`` seconds at most while every process
    is busy; ``wake`` (the scheduler's dispatch) is called when a gathering batch has waited."""

    __slots__ = ("_loop", "_timer", "_wake", "size", "wait")

    def __init__(
        self, size: int, wait: float, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]
    ) -> None:
        self.size = size
        self.wait = wait
        self._loop = loop
        self._wake = wake
        self._timer: asyncio.TimerHandle | None = None

    def next_batch(
        self, queue: Waiting, members: Sequence[Member], slots: int, now: float
    ) -> tuple[Member, int, str] | None:
        """The batch to send now: where it goes, how many of the queue's first calls it takes,
        and why (``full``, ``waited``, ``idle``: the metrics' reasons); ``None``, nothing goes
        now (a timer is set for the first call's wait). ``slots``: batches a process runs."""
        if not queue:
            return None
        size = min(self.size, len(queue))
        full = len(queue) >= self.size
        free: Member | None = None
        for member in members:
            if member.state is not ProcessState.READY:
                continue
            if not member.batches:
                return (member, size, "full" if full else "idle")
            if free is None and member.batches < slots:
                free = member
        if free is None:
            return None
        if full:
            return (free, size, "full")
        left = queue.first_queued_at() + self.wait - now
        if left <= 0:
            return (free, size, "waited")
        if self._timer is None:
            self._timer = self._loop.call_later(left, self._waited)
        return None

    def _waited(self) -> None:
        self._timer = None
        self._wake()
