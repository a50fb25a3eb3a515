"""Calls' deadlines on a few timers rather than one per call (:class:`Deadlines`): a timer per
call is a tenth of the front's work on small requests.

A call joins the set of the slot of :data:`RESOLUTION` seconds its deadline falls in; one timer
per slot expires the calls still in it (within :data:`RESOLUTION` after their deadline, never
before), and an answered call leaves its slot's set. A slot whose calls were all answered is
dropped, its timer cancelled, when a later slot is made (see :data:`_PURGED`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from abeja_runtime.front.pending import PendingCall

__all__ = ["RESOLUTION", "Deadlines"]

#: Seconds a call may be expired after its deadline.
RESOLUTION: Final = 0.01
#: Oldest slots looked at when a slot is made (more than one: a slot is made at most once
#: per RESOLUTION, and those still waited for are passed over).
_PURGED: Final = 4


class Deadlines:
    """The deadlines of the calls in flight: ``expire(call)`` once a call's has passed."""

    __slots__ = ("_expire", "_loop", "_slots")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, expire: Callable[[PendingCall], None]
    ) -> None:
        self._loop = loop
        self._expire = expire
        #: Slot number (its end, in units of RESOLUTION since the epoch) → its calls and the
        #: timer that expires them; oldest first, but for those passed over by the purge.
        self._slots: dict[int, tuple[set[PendingCall], asyncio.TimerHandle]] = {}

    def __len__(self) -> int:
        """The slots kept, each with its timer."""
        return len(self._slots)

    def watch(self, call: PendingCall, deadline: float) -> set[PendingCall]:
        """Expire ``call`` once ``deadline`` (a ``time.time()``) has passed. Returns the set it
        joined: the caller takes it out (``discard``) once the call is answered."""
        slot_end = int(deadline / RESOLUTION) + 1
        slot = self._slots.get(slot_end)
        if slot is None:
            self._purge()
            slot = self._slots[slot_end] = (set(), self._arm(slot_end))
        slot[0].add(call)
        return slot[0]

    def _purge(self) -> None:
        slots = self._slots
        for _ in range(min(_PURGED, len(slots))):
            oldest = next(iter(slots))
            slot = slots.pop(oldest)
            if slot[0]:
                slots[oldest] = slot  # still waited for: to the back
            else:
                slot[1].cancel()

    def _arm(self, slot_end: int) -> asyncio.TimerHandle:
        delay = slot_end * RESOLUTION - time.time()
        return self._loop.call_later(max(0.0, delay), self._fire, slot_end)

    def _fire(self, slot_end: int) -> None:
        calls, _ = self._slots.pop(slot_end)
        if time.time() < slot_end * RESOLUTION:  # the loop's clock ran ahead of the wall clock
            self._slots[slot_end] = (calls, self._arm(slot_end))
            return
        while calls:  # an expired call's answer may take others out meanwhile
            self._expire(calls.pop())
