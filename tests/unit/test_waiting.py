"""The fair order of waiting calls (``front/waiting.py``), with stand-in calls: which goes next."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from abeja_runtime.errors import ServiceBusy
from abeja_runtime.front.tenants import NORMAL
from abeja_runtime.front.waiting import BURST, FairOrder

_ids = itertools.count(1)


@dataclass(eq=False)
class Waiter:
    """What the order reads of a call: its id (arrival order), tenant, class, arrival."""

    tenant: str
    priority: int = NORMAL
    frame: Any = field(default_factory=lambda: SimpleNamespace(id=next(_ids)))
    queued_at: float = 0.0
    turn: float = 0.0


def fair(weights: dict[str, float] | None = None) -> FairOrder:
    return FairOrder(weights or {}, 3, 1.0)


def join(order: FairOrder, tenant: str, count: int = 1, **fields: Any) -> list[Waiter]:
    calls = [Waiter(tenant, **fields) for _ in range(count)]
    for call in calls:
        order.append(call)  # type: ignore[arg-type]
    return calls


def served(order: FairOrder, count: int) -> list[str]:
    return [order.popleft().tenant for _ in range(count)]


def test_a_tenant_with_nothing_waiting_goes_next_past_a_backlog() -> None:
    order = fair()
    join(order, "a", 50)
    assert served(order, 10) == ["a"] * 10
    join(order, "b")
    assert served(order, 1) == ["b"]


def test_a_tenant_cannot_leave_and_come_back_to_jump_the_turns() -> None:
    # b keeps one call waiting at a time, sending its next as soon as the last is taken
    order = fair()
    join(order, "a", 100)
    join(order, "b")
    taken = []
    for _ in range(40):
        tenant = order.popleft().tenant
        taken.append(tenant)
        if tenant == "b":
            join(order, "b")
    assert taken.count("b") == 20  # its share by weight, no more


def test_backlogged_tenants_are_served_by_weight_first_come_first_served_within() -> None:
    order = fair({"a": 3, "b": 1})
    a_calls = join(order, "a", 80)
    join(order, "b", 80)
    firsts = [order.popleft() for _ in range(2 * BURST)]  # each tenant's lead, at the start
    assert {call.tenant for call in firsts} == {"a", "b"}  # each had its lead
    then = [order.popleft() for _ in range(40)]
    assert sum(call.tenant == "a" for call in then) == 30
    assert [call for call in firsts + then if call.tenant == "a"] == a_calls[:34]


def test_a_tenant_below_its_share_sends_a_burst_ahead_of_a_backlog() -> None:
    order = fair()
    join(order, "a", 50)
    served(order, 10)
    join(order, "b", BURST + 3)
    # BURST of its calls before the backlog's next, then turn about
    assert served(order, BURST + 4) == ["b"] * BURST + ["a", "b", "a", "b"]


def test_an_unnamed_tenant_weighs_one() -> None:
    order = fair({"a": 0.5})
    join(order, "a", 40)
    join(order, "x", 40)
    served(order, 12)  # the leads, at the start
    assert served(order, 30).count("x") == 20


def test_a_call_given_back_keeps_its_turn() -> None:
    order = fair()
    a_calls = join(order, "a", 3)
    b_calls = join(order, "b", 3)
    first, second = order.popleft(), order.popleft()
    order.put_back(second)  # type: ignore[arg-type]
    order.put_back(first)  # type: ignore[arg-type]
    join(order, "c")
    taken = [order.popleft() for _ in range(5)]
    assert taken[:2] == [a_calls[0], b_calls[0]] == [first, second]
    assert taken[2:4] == [a_calls[1], b_calls[1]]  # c's lead: as early as theirs, after them
    assert taken[4].tenant == "c"


def test_the_newest_call_given_up_hands_its_turn_back() -> None:
    order = fair()
    join(order, "a", 5)
    _, b_newest = join(order, "b", 2)
    order.remove(b_newest)  # type: ignore[arg-type]
    served(order, 2)  # a and b's first
    again = join(order, "b")[0]
    assert again.turn == b_newest.turn
    with pytest.raises(ValueError):
        order.remove(b_newest)  # type: ignore[arg-type]


def test_calls_ahead_of_a_newcomer_are_those_with_earlier_turns() -> None:
    order = fair({"a": 1, "b": 2})
    join(order, "a", 10)
    join(order, "b", 4)
    assert order.ahead_of("c", NORMAL) == 1  # a's first shares its start, BURST before all
    assert order.ahead_of("b", NORMAL) == 4 + 4  # b's own 4, and a's up to b's fifth's turn
    join(order, "h", 3, priority=0)
    assert order.ahead_of("c", NORMAL) == 3 + 1


@pytest.mark.parametrize("backlog", [0, 1, 50])
def test_a_flood_of_one_off_tenants_leaves_no_turns_behind(backlog: int) -> None:
    order = fair()
    join(order, "a", backlog)
    for number in range(10_000):
        join(order, f"t{number}")
        order.popleft()
    klass = order._classes[NORMAL]
    assert len(klass.finish) <= 2 * len(klass.queues) + 64
    assert len(order) == backlog


def test_a_full_queue_makes_room_from_the_tenant_most_past_its_share() -> None:
    order = fair()
    a_calls = join(order, "a", 4)
    newcomer = Waiter("b")
    assert order.room_for(newcomer, 4, full=True) is a_calls[-1]  # type: ignore[arg-type]
    order.append(newcomer)  # type: ignore[arg-type]
    with pytest.raises(ServiceBusy):  # a is at its share now
        order.room_for(Waiter("a"), 4, full=True)  # type: ignore[arg-type]
    assert served(order, 2) == ["a", "b"]


def test_a_backlogged_tenants_turns_outlive_the_forgetting_of_tenants_gone() -> None:
    order = fair()
    join(order, "a", 40)
    taken = []
    for number in range(300):  # one-off tenants (many forgotten), and b now and then
        join(order, f"t{number}")
        if number % 50 == 0:
            join(order, "b")
        taken.append(order.popleft().tenant)
    assert taken.count("b") == 6
    a_turns = [call.turn for call in order._classes[NORMAL].queues["a"]]
    assert a_turns == sorted(a_turns)  # its tags stay in order: none was forgotten


def test_new_tenants_cannot_hold_a_backlog_back() -> None:
    order = fair()
    join(order, "x", 3000)
    taken = []
    for number in range(2000):  # a new tenant for each call served, while places are left
        if len(order) - (3000 - taken.count("x")) < 3:  # (3 places for newcomers)
            join(order, f"new{number}")
        taken.append(order.popleft().tenant)
    # Each new tenant has its lead, yet x keeps a part (each call taken early moves the leads
    # on): without that, x got no call at all.
    assert taken[1000:].count("x") >= 80


@pytest.mark.parametrize("seed", range(5))
def test_turning_away_at_the_door_is_what_room_for_refuses(seed: int) -> None:
    """The door's question (``turns_away``, nothing taken) and the queue's answer
    (``room_for``'s ServiceBusy) agree, over random queues of three tenants and three classes,
    weighed, full or not."""
    rng = random.Random(seed)
    order = fair({"a": 3, "b": 1})
    places = 12
    checked = 0
    for _ in range(400):
        tenant, priority = rng.choice("abc"), rng.randrange(3)
        full = len(order) >= places
        refused = order.turns_away(tenant, priority, places, full=full)
        before = len(order)
        newcomer = Waiter(tenant, priority)
        try:
            taken = order.room_for(newcomer, places, full=full)  # type: ignore[arg-type]
        except ServiceBusy:
            assert refused and len(order) == before
            checked += 1
        else:
            assert not refused
            assert len(order) == before - (taken is not None)
            order.append(newcomer)  # type: ignore[arg-type]
        if order and rng.random() < 0.3:
            order.popleft()
    assert checked  # some were refused: the comparison covered both answers
