"""The call service (``front/calls.py``) on a real event loop, over the scheduler with fake
processes: deadlines, admission, refusals, places for bodies and accounting, as every way into
the front uses them (issue 29)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from abeja_runtime.errors import HandlerTimeout, ServiceBusy
from abeja_runtime.frames import Call, Cancel
from abeja_runtime.front.accounting import CLIENT_CLOSED
from abeja_runtime.front.calls import CallService
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.metrics import FrontMetrics

from .fakes import FakePool


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def service(tmp_path: Path, **settings: Any) -> tuple[FakePool, CallService, FrontMetrics]:
    fake = FakePool(**settings)
    metrics = FrontMetrics("test", "main:handler", "abeja", str(tmp_path), lambda: (0, 0))
    return fake, CallService(fake.config, fake.pool, metrics), metrics


def pending(calls: CallService) -> PendingCall:
    call_id = calls.next_id()
    frame = Call(call_id, "GET", "/", "", (), f"id-{call_id}", None, b"", "", 0)
    return PendingCall(frame, calls.loop)


def counted(metrics: FrontMetrics, name: str, **labels: str) -> float:
    text = metrics.render().decode()
    label = ",".join(f'{key}="{value}"' for key, value in labels.items())
    found = re.search(rf"^{name}{{{label}}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_call_past_its_deadline_gets_504_and_is_cancelled_in_its_process(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        fake, calls, _ = service(tmp_path, timeout=0.05)
        (process,) = fake.made
        process.ready()
        call = pending(calls)
        with pytest.raises(HandlerTimeout):
            await calls.call(call, time.time(), None)
        assert process.frames[-1] == Cancel(call.frame.id)

    run(scenario)


def test_readiness_stops_at_the_drain_and_admission_goes_on(tmp_path: Path) -> None:
    """Balancers send until they see readiness fail: what reaches the front is still served."""

    async def scenario() -> None:
        fake, calls, _ = service(tmp_path)
        fake.made[0].ready()
        assert calls.admitting and calls.ready
        calls.draining = True
        assert calls.admitting and not calls.ready

    run(scenario)


def test_refusals_are_counted_by_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, calls, metrics = service(tmp_path)
        reply = calls.refusal(ServiceBusy())
        assert reply.status == 503 and ("Retry-After", "1") in reply.headers
        assert counted(metrics, "abeja_runtime_rejected_requests_total", reason="busy") == 1.0

    run(scenario)


def test_a_call_is_counted_once_and_an_uncounted_one_as_client_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, calls, metrics = service(tmp_path)
        answered = calls.accounting.open("GET", "/", 0.0, "a")
        answered.count(200)
        answered.count(500)  # a later status is not counted again
        answered.end()
        answered.end()
        left = calls.accounting.open("GET", "/", 0.0, "b")
        assert calls.accounting.in_flight == 1
        left.end()  # its client left before it was counted
        assert left.status == CLIENT_CLOSED and calls.accounting.in_flight == 0
        assert counted(metrics, "abeja_runtime_requests_total", code="200") == 1.0
        assert counted(metrics, "abeja_runtime_requests_total", code="499") == 1.0
        assert counted(metrics, "abeja_runtime_requests_total", code="500") == 0.0

    run(scenario)


def test_a_body_waits_for_a_place_and_is_refused_when_the_queue_could_not_take_it(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        fake, calls, _ = service(tmp_path, max_queue=1)  # places: 1 + 4; queue room: 2
        fake.made[0].ready()
        for _ in range(5):
            await calls.enter_gate()  # every place taken at once
        waiter = asyncio.ensure_future(calls.enter_gate())
        await asyncio.sleep(0)
        assert not waiter.done() and calls.gate.waiting == 1
        second = asyncio.ensure_future(calls.enter_gate())
        await asyncio.sleep(0)  # two wait: as many as the queue takes
        with pytest.raises(ServiceBusy):
            await calls.enter_gate()
        calls.gate.leave()  # a place comes free: the first in line takes it
        await asyncio.wait_for(waiter, 5)
        assert not second.done()
        second.cancel()

    run(scenario)
