"""The calls that wait for a slot, and which goes next: in arrival order (:class:`ArrivalOrder`,
the default), or by priority class and weighted fairness across tenants (:class:`FairOrder`,
``--tenant-header`` or ``--priority-header``).

Both are what the scheduler (``scheduler.py``) takes from: ``append``, ``popleft``, ``remove``,
``put_back`` (a call given back, before the calls that came after it), ``first_queued_at``,
iteration, ``len``.

For :class:`FairOrder` the next call is of the class whose oldest call came first, a class's
arrivals counted ``--priority-aging`` seconds later per class below the highest: a higher class goes
first, and a lower call goes before the higher ones that came that long after it (so it waits at
most that per class, plus the calls older than it). Within a class, tenants take turns by start-time
fair queuing (Goyal, Vin and Cheng): a call's start tag is the later of the class's progress (the
start tag of the last call taken in its turn) and its tenant's previous finish tag, its finish tag
its start plus 1 / the tenant's weight, and the smallest start tag goes next. So each tenant with
calls waiting is served in proportion to its weight, first come first served within a tenant. A
tenant that kept below its share gets a lead (:data:`BURST`): its few calls wait behind the calls
that run, not behind another tenant's backlog; each call taken early moves the earliest lead on by a
turn shared among the tenants waiting, so that a stream of new tenants cannot hold a backlog back.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Final

from abeja_runtime.errors import ServiceBusy

if TYPE_CHECKING:
    from abeja_runtime.front.pending import PendingCall

__all__ = ["BURST", "ArrivalOrder", "FairOrder", "Waiting"]

#: The lead of a tenant that kept below its share: with equal weights, this many of its calls
#: go before the next call of another tenant's backlog.
BURST: Final = 4


class ArrivalOrder(deque["PendingCall"]):
    """First come, first served: a deque, and :meth:`put_back`."""

    def put_back(self, pending: PendingCall) -> None:
        """Back in the queue before the calls that came after it (ids grow with arrival)."""
        index = 0
        call_id = pending.frame.id
        while index < len(self) and self[index].frame.id < call_id:
            index += 1
        self.insert(index, pending)

    def first_queued_at(self) -> float:
        """When the call that waits longest joined (the queue is not empty)."""
        return self[0].queued_at


class _Class:
    """The calls of one priority class: a queue per tenant, in start-time fair order."""

    __slots__ = ("finish", "lead", "queues", "virtual", "weight")

    def __init__(self, weight: Callable[[str], float]) -> None:
        self.weight = weight
        self.queues: dict[str, deque[PendingCall]] = {}
        #: The start tag of the call taken last: how far the class's turns have come.
        self.virtual = 0.0
        #: Each tenant's last finish tag, while it holds its next call back (kept when its
        #: queue empties, so that a tenant cannot leave and come back to jump the turns).
        self.finish: dict[str, float] = {}
        #: The earliest start tag a lead gives now (see the module).
        self.lead = -math.inf

    def next_tenant(self) -> str:
        """Whose call goes next (this class has calls): the smallest start tag, the earlier
        arrival on a tie."""
        return min(self.queues, key=lambda tenant: _tag(self.queues[tenant][0]))

    def start_tag(self, tenant: str) -> float:
        """The start tag of a call of ``tenant`` joining now: after its previous call's turn,
        and at most its lead before the class's progress."""
        return max(self._earliest(tenant), self.finish.get(tenant, -math.inf))

    def _earliest(self, tenant: str) -> float:
        """The earliest start tag of ``tenant``'s calls: ``BURST - 1`` of its turns before the
        class's progress, and not before :attr:`lead`."""
        return max(self.virtual - (BURST - 1) / self.weight(tenant), self.lead)

    def add(self, tenant: str, pending: PendingCall, *, front: bool) -> None:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
        if front:  # given back: its tags kept, before the calls after it
            bisect.insort(queue, pending, key=_id)
            return
        pending.turn = self.start_tag(tenant)
        self.finish[tenant] = pending.turn + 1 / self.weight(tenant)
        queue.append(pending)

    def take(self, tenant: str, pending: PendingCall, *, served: bool) -> None:
        """``pending`` (of ``tenant``) leaves the class: ``served``, to a process; else given
        up or evicted, when its tenant's turn is handed back if it was the newest."""
        queue = self.queues[tenant]
        queue.remove(pending)
        if served and pending.turn <= self.virtual:  # early (or tied): later leads go after it
            shared = sum(self.weight(waiting) for waiting in self.queues)
            self.lead = max(self.lead, pending.turn) + 1 / shared
        elif served:
            self.virtual = pending.turn
        elif self.finish.get(tenant) == pending.turn + 1 / self.weight(tenant):
            self.finish[tenant] = pending.turn
        if queue:
            return
        del self.queues[tenant]
        if not self.queues:  # nothing waits: every tenant starts afresh
            self.finish.clear()
            self.lead = -math.inf
        elif len(self.finish) > 2 * len(self.queues) + 64:
            # a tenant with nothing waiting is forgotten once its lead is whole again, or, when
            # too many are, at once (it may take its whole lead when it comes back)
            kept = {
                t: at for t, at in self.finish.items() if t in self.queues or at > self._earliest(t)
            }
            if len(kept) > 2 * len(self.queues) + 64:
                kept = {t: kept[t] for t in self.queues}
            self.finish = kept

    def ahead_of(self, tenant: str) -> int:
        """How many of its calls go before one of ``tenant`` joining now."""
        turn = self.start_tag(tenant)
        return sum(bisect.bisect_right(queue, turn, key=_turn) for queue in self.queues.values())

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def oldest(self) -> PendingCall:
        return min((queue[0] for queue in self.queues.values()), key=_arrival)


_tag = operator.attrgetter("turn", "frame.id")
_id = operator.attrgetter("frame.id")
_turn = operator.attrgetter("turn")
_arrival = operator.attrgetter("queued_at")


class FairOrder:
    """Priority classes (``0`` the highest), weighted fairness across tenants within each
    (see the module); a tenant not in ``weights`` weighs 1."""

    __slots__ = ("_aging", "_classes", "_count", "_tenants", "_weight_waiting", "weights")

    def __init__(self, weights: Mapping[str, float], classes: int, aging: float) -> None:
        self.weights = dict(weights)
        self._aging = aging
        self._classes = [_Class(self.weight) for _ in range(classes)]
        self._count = 0
        #: Calls waiting per tenant (every class).
        self._tenants: dict[str, int] = {}
        #: The sum of their weights.
        self._weight_waiting = 0.0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[PendingCall]:
        for klass in self._classes:
            for queue in klass.queues.values():
                yield from queue

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def first_queued_at(self) -> float:
        """When the call that waits longest joined (the queue is not empty)."""
        return min(klass.oldest().queued_at for klass in self._classes if klass.queues)

    def ahead_of(self, tenant: str, priority: int) -> int:
        """How many waiting calls go before a call of ``tenant`` in class ``priority`` joining
        now: those of the higher classes, and those of its own with earlier turns."""
        ahead = sum(len(klass) for klass in self._classes[:priority])
        return ahead + self._classes[priority].ahead_of(tenant)

    def append(self, pending: PendingCall) -> None:
        self._add(pending, front=False)

    def put_back(self, pending: PendingCall) -> None:
        self._add(pending, front=True)

    def _add(self, pending: PendingCall, *, front: bool) -> None:
        tenant = pending.tenant
        self._classes[pending.priority].add(tenant, pending, front=front)
        self._count += 1
        held = self._tenants.get(tenant, 0)
        if not held:
            self._weight_waiting += self.weight(tenant)
        self._tenants[tenant] = held + 1

    def popleft(self) -> PendingCall:
        """The call that goes next (the queue is not empty), taken out."""
        klass = self._next_class()
        pending = klass.queues[klass.next_tenant()][0]
        self._take(klass, pending, served=True)
        return pending

    def remove(self, pending: PendingCall) -> None:
        """``pending`` leaves the queue; ``ValueError`` when it is not in it."""
        klass = self._classes[pending.priority]
        queue = klass.queues.get(pending.tenant)
        if queue is None or pending not in queue:
            raise ValueError("not waiting")
        self._take(klass, pending, served=False)

    def room_for(self, pending: PendingCall, places: int, *, full: bool) -> PendingCall | None:
        """Whether ``pending`` may join: while its tenant holds less than its weighted share of
        the ``places`` (among the tenants waiting), and there is room (not ``full``). Else a
        waiting call makes room, taken out and returned: the newest (of its lowest class) of
        the tenant most past its share; or the newest of a class below ``pending``'s (its own
        tenant's, when that tenant is at its share). Else :class:`ServiceBusy`."""
        room = self._room(pending.tenant, pending.priority, places, full)
        if room is False:
            raise ServiceBusy()
        if room is True:
            return None
        klass, queue = room
        taken = queue[-1]
        self._take(klass, taken, served=False)
        return taken

    def turns_away(self, tenant: str, priority: int, places: int, *, full: bool) -> bool:
        """Whether a call of ``tenant`` in class ``priority`` would be refused now
        (:meth:`room_for`'s :class:`ServiceBusy`), nothing taken."""
        return self._room(tenant, priority, places, full) is False

    def _room(
        self, tenant: str, priority: int, places: int, full: bool
    ) -> tuple[_Class, deque[PendingCall]] | bool:
        """:meth:`room_for`'s rule: ``True``, a call of ``tenant`` in class ``priority`` joins
        as it is; a class and a queue, whose newest call makes room for it; ``False``, none."""
        waiting = self._tenants
        held = waiting.get(tenant, 0)
        total = self._weight_waiting if held else self._weight_waiting + self.weight(tenant)

        def past_share(other: str) -> float:
            return waiting.get(other, 0) - places * self.weight(other) / total

        at_share = bool(held) and past_share(tenant) >= 0
        if not at_share and not full:
            return True
        if not at_share:
            most = max(waiting, key=past_share, default=tenant)
            if most != tenant and past_share(most) > 0:
                for klass in reversed(self._classes):
                    queue = klass.queues.get(most)
                    if queue:
                        return klass, queue
        for klass in reversed(self._classes[priority + 1 :]):
            queues = [klass.queues[tenant]] if at_share and tenant in klass.queues else []
            if not at_share:
                queues = list(klass.queues.values())
            if queues:
                return klass, max(queues, key=lambda queue: queue[-1].queued_at)
        return False

    def _take(self, klass: _Class, pending: PendingCall, *, served: bool) -> None:
        klass.take(pending.tenant, pending, served=served)
        self._count -= 1
        left = self._tenants[pending.tenant] - 1
        if left:
            self._tenants[pending.tenant] = left
        else:
            del self._tenants[pending.tenant]
            self._weight_waiting -= self.weight(pending.tenant)
            if not self._tenants:  # (no drift of the sum's rounding)
                self._weight_waiting = 0.0

    def _next_class(self) -> _Class:
        """The class whose oldest call came first, each class's arrivals counted ``aging``
        seconds later per class below the highest (see the module)."""
        best, best_at = self._classes[0], math.inf
        for level, klass in enumerate(self._classes):
            if klass.queues:
                at = klass.oldest().queued_at + level * self._aging
                if at < best_at:
                    best, best_at = klass, at
        return best


#: What the scheduler takes from.
Waiting = ArrivalOrder | FairOrder
