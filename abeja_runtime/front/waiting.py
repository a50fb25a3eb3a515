"""The calls that wait for a slot, and which goes next: in arrival order (:class:`ArrivalOrder`,
the default), or by priority class and weighted fairness across tenants (:class:`FairOrder`,
``--tenant-header`` or ``--priority-header``).

Both are what the scheduler (``scheduler.py``) takes from: ``append`` a call, ``popleft`` the
next, ``remove`` one given up, ``put_back`` one a process gave back (before the calls that came
after it), ``first_queued_at``, iterate over all, ``len``.

For :class:`FairOrder` the next call is of the class whose oldest call came first, a class's
arrivals counted ``--priority-aging`` seconds later per class below the highest: a higher class
goes first, and a lower call goes before the higher ones that came that long after it. Within a
class, tenants take turns by deficit round robin (Shreedhar and Varghese): each turn a tenant is
credited its weight, and a call costs one credit, so that over time each tenant is served in
proportion to its weight while it has calls waiting; within a tenant, first come first served.
A call is charged when it leaves the queue: the scheduler does not hold calls in a process's
socket ahead of time with tenants on (a call given back would lose its tenant's turn).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from abeja_runtime.errors import ServiceBusy

if TYPE_CHECKING:
    from abeja_runtime.front.pending import PendingCall

__all__ = ["ArrivalOrder", "FairOrder", "Waiting"]


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
    """The calls of one priority class: a queue per tenant, taking turns by deficit round
    robin."""

    __slots__ = ("credit", "queues", "turns")

    def __init__(self) -> None:
        self.queues: dict[str, deque[PendingCall]] = {}
        #: The tenants with calls waiting, the one whose turn it is first.
        self.turns: deque[str] = deque()
        self.credit: dict[str, float] = {}

    def next_tenant(self, weights: Mapping[str, float]) -> str:
        """Whose call goes next (this class has calls): the tenant whose turn it is while its
        credit lasts, then the next one, credited its weight (at least 1: one call a turn)."""
        turns, credit = self.turns, self.credit
        while credit[turns[0]] < 1:
            turns.rotate(-1)
            tenant = turns[0]
            credit[tenant] += weights.get(tenant, 1.0)
        return turns[0]

    def add(self, tenant: str, pending: PendingCall, weight: float, *, front: bool) -> None:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
            self.turns.append(tenant)
            self.credit[tenant] = weight  # its first turn, when it comes
        if not front:
            queue.append(pending)
            return
        ids = [call.frame.id for call in queue]
        queue.insert(bisect.bisect_left(ids, pending.frame.id), pending)

    def take(self, tenant: str, pending: PendingCall) -> None:
        """``pending`` (of ``tenant``) leaves the class."""
        queue = self.queues[tenant]
        queue.remove(pending)
        if not queue:
            del self.queues[tenant], self.credit[tenant]
            self.turns.remove(tenant)

    def __len__(self) -> int:
        return sum(len(queue) for queue in self.queues.values())

    def oldest(self) -> PendingCall:
        return min((queue[0] for queue in self.queues.values()), key=_arrival)


def _arrival(pending: PendingCall) -> float:
    return pending.queued_at


class FairOrder:
    """Priority classes (``0`` the highest), weighted fairness across tenants within each
    (see the module); a tenant not in ``weights`` weighs 1."""

    __slots__ = ("_aging", "_classes", "_count", "_tenants", "_unnamed", "weights")

    def __init__(self, weights: Mapping[str, float], classes: int, aging: float) -> None:
        #: The weights as credits a turn: the lightest tenant (or 1, a tenant not named) gets
        #: one call a turn, so that a turn never passes without a call.
        lightest = min((1.0, *weights.values()))
        self.weights = {tenant: weight / lightest for tenant, weight in weights.items()}
        self._unnamed = 1.0 / lightest
        self._aging = aging
        self._classes = [_Class() for _ in range(classes)]
        self._count = 0
        #: Calls waiting per tenant (every class).
        self._tenants: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[PendingCall]:
        for klass in self._classes:
            for queue in klass.queues.values():
                yield from queue

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, self._unnamed)

    def first_queued_at(self) -> float:
        """When the call that waits longest joined (the queue is not empty)."""
        return min(klass.oldest().queued_at for klass in self._classes if klass.queues)

    def ahead_of(self, tenant: str, priority: int) -> int:
        """About how many waiting calls go before a call of ``tenant`` in class ``priority``
        joining now: those of the higher classes, and in its own the tenant's calls and the
        others' turns between them (by weight)."""
        ahead = sum(len(klass) for klass in self._classes[:priority])
        klass = self._classes[priority]
        own = len(klass.queues.get(tenant, ())) + 1
        for other, queue in klass.queues.items():
            if other != tenant:
                ahead += min(len(queue), math.ceil(own * self.weight(other) / self.weight(tenant)))
        return ahead + own - 1

    def append(self, pending: PendingCall) -> None:
        self._add(pending, front=False)

    def put_back(self, pending: PendingCall) -> None:
        self._add(pending, front=True)

    def _add(self, pending: PendingCall, *, front: bool) -> None:
        tenant = pending.tenant
        self._classes[pending.priority].add(tenant, pending, self.weight(tenant), front=front)
        self._count += 1
        self._tenants[pending.tenant] = self._tenants.get(pending.tenant, 0) + 1

    def popleft(self) -> PendingCall:
        """The call that goes next (the queue is not empty), taken out."""
        klass = self._next_class()
        tenant = klass.next_tenant(self.weights)
        pending = klass.queues[tenant][0]
        klass.credit[tenant] -= 1
        self._take(klass, pending)
        return pending

    def remove(self, pending: PendingCall) -> None:
        """``pending`` leaves the queue; ``ValueError`` when it is not in it."""
        klass = self._classes[pending.priority]
        queue = klass.queues.get(pending.tenant)
        if queue is None or pending not in queue:
            raise ValueError("not waiting")
        self._take(klass, pending)

    def room_for(self, pending: PendingCall, places: int, *, full: bool) -> PendingCall | None:
        """Whether ``pending`` may join: while its tenant holds less than its weighted share of
        the ``places`` (among the tenants waiting), and there is room (not ``full``). Else a
        waiting call makes room, taken out and returned: the newest (of its lowest class) of
        the tenant most past its share; or the newest of a class below ``pending``'s (its own
        tenant's, when that tenant is at its share). Else :class:`ServiceBusy`."""
        tenant = pending.tenant
        waiting = dict(self._tenants)
        waiting.setdefault(tenant, 0)
        total = sum(self.weight(other) for other in waiting)

        def past_share(other: str) -> float:
            return waiting[other] - places * self.weight(other) / total

        at_share = bool(waiting[tenant]) and past_share(tenant) >= 0
        if not at_share and not full:
            return None
        most = max(waiting, key=past_share)
        if not at_share and most != tenant and past_share(most) > 0:
            for klass in reversed(self._classes):
                queue = klass.queues.get(most)
                if queue:
                    return self._take_newest(klass, queue)
        for klass in reversed(self._classes[pending.priority + 1 :]):
            queues = [klass.queues[tenant]] if at_share and tenant in klass.queues else []
            if not at_share:
                queues = list(klass.queues.values())
            if queues:
                return self._take_newest(klass, max(queues, key=lambda queue: queue[-1].queued_at))
        raise ServiceBusy()

    def _take_newest(self, klass: _Class, queue: deque[PendingCall]) -> PendingCall:
        taken = queue[-1]
        self._take(klass, taken)
        return taken

    def _take(self, klass: _Class, pending: PendingCall) -> None:
        klass.take(pending.tenant, pending)
        self._count -= 1
        left = self._tenants[pending.tenant] - 1
        if left:
            self._tenants[pending.tenant] = left
        else:
            del self._tenants[pending.tenant]

    def _next_class(self) -> _Class:
        """The class whose oldest call came first, each class's arrivals counted ``aging``
        seconds later per class below the highest: a higher class goes first, but a call of
        a lower class goes before higher ones that came that long after it (so neither waits
        without end: a lower call at most ``aging`` per class, plus the calls older than it)."""
        best, best_at = self._classes[0], math.inf
        for level, klass in enumerate(self._classes):
            if klass.queues:
                at = klass.oldest().queued_at + level * self._aging
                if at < best_at:
                    best, best_at = klass, at
        return best


#: What the scheduler takes from.
Waiting = ArrivalOrder | FairOrder
