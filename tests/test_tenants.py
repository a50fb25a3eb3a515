"""Tenants and priorities (``--tenant-header``, ``--tenant-weights``, ``--priority-header``):
waiting calls are served by priority class, then by weighted fairness across tenants; a tenant
holds at most its share of the queue, so that a flooding tenant gets the ``503``s and the others
do not. Over HTTP and gRPC, with one slot, so that the order in which calls start is the order
in which the queue gives them."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from helpers.raw_http import events
from helpers.servers import Response, RunningServer, ServerFactory
from helpers.waiting import wait_until

from abeja_runtime.front.waiting import BURST

SYNC = {"HANDLER": "main:handler"}
ONE_SLOT = ("--workers", "1", "--concurrency", "1")


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(32) as executor:
        yield executor


def send(
    pool: ThreadPoolExecutor, server: RunningServer, tag: str, headers: dict[str, str]
) -> Future[Response]:
    return pool.submit(server.request, "POST", f"/?tag={tag}", b"{}", headers)


def queued(server: RunningServer, count: int) -> None:
    wait_until(lambda: server.queued() >= count, 30, f"{count} calls to wait in the queue")


def queue_in_order(
    pool: ThreadPoolExecutor, server: RunningServer, calls: list[tuple[str, dict[str, str]]]
) -> list[Future[Response]]:
    """Each ``(tag, headers)`` sent once the one before it waits in the queue (the slot is
    held): they join in this order."""
    sent = []
    for index, (tag, headers) in enumerate(calls):
        sent.append(send(pool, server, tag, headers))
        queued(server, index + 1)
    return sent


def start_order(server: RunningServer, tags: list[str]) -> list[str]:
    """``tags`` in the order the handler started them (their lines read, waited for)."""
    wait_until(
        lambda: all(events(server, "start", tag) for tag in tags), 10, "the calls' start lines"
    )
    started = {tag: events(server, "start", tag)[0]["t"] for tag in tags}
    return sorted(tags, key=started.__getitem__)


def hold(pool: ThreadPoolExecutor, server: RunningServer, release: Path) -> Future[Response]:
    """A call that keeps the one slot until ``release`` exists."""
    held = pool.submit(server.request, "POST", f"/?tag=holder&until={release}", b"{}")
    wait_until(lambda: events(server, "start", "holder"), 30, "the slot to be taken")
    return held


def test_a_flooding_tenant_gets_the_503s_and_another_is_served_first(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "4", "--tenant-header", "x-tenant",
        "--tenant-weights", "a=1,b=1", env=SYNC,
    )  # fmt: skip
    release = tmp_path / "release"
    held = hold(pool, server, release)
    # One after the other (a3 the newest); tenant a alone: it may fill every place.
    flood = queue_in_order(pool, server, [(f"a{index}", {"x-tenant": "a"}) for index in range(4)])
    extra = {"x-tenant": "a", "x-abeja-request-id": "a-extra", "Request-Timeout": "30"}
    refused = server.request("POST", "/?tag=a-extra", b"{}", extra)
    assert refused.status == 503  # its share is full: refused at the door, before any call
    assert (refused.json(), refused.headers["Retry-After"]) == ({"status": "service busy"}, "1")
    assert refused.headers["x-abeja-request-id"] == "a-extra"
    record = server.wait_for_record(lambda r: r.get("request_id") == "a-extra")
    assert (record["http_status"], record["tenant"], record["priority"]) == (503, "a", "normal")
    assert (record["deadline"], "refused" in record) == (30, False)  # busy, not its deadline
    b = send(pool, server, "b0", {"x-tenant": "b"})  # takes the place of a's newest call
    assert flood[3].result(30).status == 503
    release.touch()
    assert held.result(30).status == 200
    assert b.result(30).status == 200
    assert [call.result(30).status for call in flood[:3]] == [200, 200, 200]
    order = start_order(server, ["a0", "a1", "a2", "b0"])
    assert order.index("b0") <= 1, order  # b waits for one call at most, not a's whole queue
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    assert counted(metrics, "tenant_served_requests", "b") == 1
    assert counted(metrics, "tenant_refused_requests", "a") == 2
    busy = re.search(
        r'^abeja_runtime_rejected_requests_total\{reason="busy"\} (\S+)$', metrics, re.M
    )
    assert busy is not None and float(busy.group(1)) == 2
    record = server.wait_for_record(lambda r: r.get("tenant") == "b")
    assert (record["http_status"], record["priority"]) == (200, "normal")


def test_with_api_key_tenants_a_flooding_key_is_refused_at_its_share(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    """``--tenant-header api-key``: the tenant is the key's short hash, known once the key was
    checked; a key past its share is refused (recorded with its caller and tenant), another
    key's call takes a place."""
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "2", "--tenant-header", "api-key",
        "--api-keys", "k-one,k-two", env=SYNC,
    )  # fmt: skip
    one, two = {"X-API-Key": "k-one"}, {"X-API-Key": "k-two"}
    release = tmp_path / "release"
    held = pool.submit(server.request, "POST", f"/?tag=holder&until={release}", b"{}", one)
    wait_until(lambda: events(server, "start", "holder"), 30, "the slot to be taken")
    flood = queue_in_order(pool, server, [(f"one{index}", one) for index in range(2)])
    refused = server.request("POST", "/", b"{}", {**one, "x-abeja-request-id": "one-extra"})
    assert refused.status == 503
    record = server.wait_for_record(lambda r: r.get("request_id") == "one-extra")
    hashed = hashlib.sha256(b"k-one").hexdigest()[:8]
    assert (record["http_status"], record["caller"], record["tenant"]) == (503, hashed, hashed)
    other = send(pool, server, "two0", two)  # takes the place of k-one's newest call
    assert flood[1].result(30).status == 503
    release.touch()
    assert (held.result(30).status, other.result(30).status) == (200, 200)
    assert flood[0].result(30).status == 200


def counted(metrics: str, name: str, tenant: str) -> float:
    found = re.search(rf'^abeja_runtime_{name}_total\{{tenant="{tenant}"\}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


def test_tenants_are_served_in_proportion_to_their_weights(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "40", "--tenant-header", "x-tenant",
        "--tenant-weights", "heavy=3,light=1", env=SYNC,
    )  # fmt: skip
    release = tmp_path / "release"
    held = hold(pool, server, release)
    tags = [f"heavy{i}" for i in range(16)] + [f"light{i}" for i in range(8)]
    # (light's share of the 40 places: 10)
    calls = queue_in_order(
        pool, server, [(tag, {"x-tenant": tag.rstrip("0123456789")}) for tag in tags]
    )
    release.touch()
    assert held.result(30).status == 200
    assert all(call.result(30).status == 200 for call in calls)
    order = start_order(server, tags)
    # Each tenant's first BURST calls come early (neither had calls waiting before), then
    # they take turns by weight: 3 heavy calls for each light one.
    after_leads = order[2 * BURST : 2 * BURST + 16]
    assert sum(tag.startswith("heavy") for tag in after_leads) == 12, order
    # Within a tenant, first come first served.
    assert [tag for tag in order if tag.startswith("light")] == [f"light{i}" for i in range(8)]
    assert [tag for tag in order if tag.startswith("heavy")] == [f"heavy{i}" for i in range(16)]


def test_a_higher_priority_goes_first_and_a_lower_one_is_not_starved(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "8", "--priority-header", "x-priority",
        "--priority-aging", "60", env=SYNC,
    )  # fmt: skip
    release = tmp_path / "release"
    held = hold(pool, server, release)
    priorities = ["low", "normal", "high", "bogus", "high"]
    calls = queue_in_order(
        pool,
        server,
        [(f"{name}{index}", {"x-priority": name}) for index, name in enumerate(priorities)],
    )
    release.touch()
    assert held.result(30).status == 200
    assert all(call.result(30).status == 200 for call in calls)
    order = start_order(server, ["low0", "normal1", "high2", "bogus3", "high4"])
    assert order == ["high2", "high4", "normal1", "bogus3", "low0"], order


def test_priorities_and_tenants_apply_to_grpc_calls(
    make_server: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("kserve")
    from helpers.grpc_calls import ASYNC_MODEL, with_grpc
    from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
    from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as stubs

    server = with_grpc(
        make_server, "st_kserve_async", "--concurrency", "1", "--priority-header", "x-priority",
        "--priority-aging", "60", "--tenant-header", "x-tenant", env=ASYNC_MODEL,
    )  # fmt: skip

    def infer(seconds: float, metadata: list[tuple[str, str]]) -> Any:
        tensor = pb.ModelInferRequest.InferInputTensor(
            name="sleep", datatype="FP64", shape=[1],
            contents=pb.InferTensorContents(fp64_contents=[seconds]),
        )  # fmt: skip
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            request = pb.ModelInferRequest(model_name="model", inputs=[tensor])
            return stubs.GRPCInferenceServiceStub(channel).ModelInfer(
                request, timeout=60, metadata=metadata
            )

    holder = pool.submit(infer, 2.0, [("x-tenant", "holder")])
    wait_until(lambda: server.in_flight() >= 1, 10, "the slot to be taken")
    low = pool.submit(infer, 0, [("x-priority", "low"), ("x-tenant", "t")])
    queued(server, 1)
    high = pool.submit(infer, 0, [("x-priority", "high"), ("x-tenant", "t")])
    queued(server, 2)
    for call in (holder, low, high):
        call.result(60)
    answered = {
        priority: server.wait_for_record(lambda r, p=priority: r.get("priority") == p)
        for priority in ("high", "low")
    }
    assert answered["high"]["tenant"] == answered["low"]["tenant"] == "t"
    # The server's own clock: high answered before low, though low came first.
    assert answered["high"]["response_timestamp"] < answered["low"]["response_timestamp"]


def test_a_lower_class_waits_at_most_the_aging_bound(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "8", "--priority-header", "x-priority",
        "--priority-aging", "0.3", env=SYNC,
    )  # fmt: skip
    release = tmp_path / "release"
    held = hold(pool, server, release)
    low = send(pool, server, "old-low", {"x-priority": "low"})
    queued(server, 1)
    began = time.monotonic()  # low is two classes below high: twice the bound
    wait_until(lambda: time.monotonic() - began > 0.7, 5, "the low call to wait past the bound")
    high = send(pool, server, "new-high", {"x-priority": "high"})
    queued(server, 2)
    release.touch()
    for call in (held, low, high):
        assert call.result(30).status == 200
    assert start_order(server, ["old-low", "new-high"]) == ["old-low", "new-high"]


def test_tenant_weights_that_are_not_pairs_are_refused() -> None:
    from abeja_runtime.config import tenant_weights

    assert tenant_weights("a=2, b=0.5") == {"a": 2.0, "b": 0.5}
    with pytest.raises(ValueError, match="name=weight pairs"):
        tenant_weights("a=2,b")
    for weight in ("0", "inf", "nan", "1e-300", "5000"):
        with pytest.raises(ValueError, match=f"'c={weight}' is not"):
            tenant_weights(f"c={weight}")


def test_a_newcomer_waits_for_the_turns_not_for_the_whole_flood(
    make_server: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    """No call is held in the worker's socket ahead of its turn: the calls of a flood sent at
    once do not all go before a tenant that comes a moment later."""
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "20", "--tenant-header", "x-tenant",
        "--tenant-weights", "a=4,c=1", env=SYNC,
    )  # fmt: skip
    flood = [
        pool.submit(server.request, "POST", f"/?tag=a{i}&sleep=0.1", b"{}", {"x-tenant": "a"})
        for i in range(12)
    ]
    queued(server, 8)
    newcomer = send(pool, server, "c0", {"x-tenant": "c"})
    assert newcomer.result(30).status == 200
    assert all(call.result(30).status == 200 for call in flood)
    order = start_order(server, [f"a{i}" for i in range(12)] + ["c0"])
    # c, below its share, goes before a's waiting calls: after the calls then running.
    assert order.index("c0") <= 7, order


def test_a_higher_class_takes_the_place_of_a_lower_one_when_the_queue_is_full(
    make_server: ServerFactory, pool: ThreadPoolExecutor, tmp_path: Path
) -> None:
    server = make_server(
        "ex_sleep", *ONE_SLOT, "--max-queue", "2", "--priority-header", "x-priority",
        "--priority-aging", "60", env=SYNC,
    )  # fmt: skip
    release = tmp_path / "release"
    held = hold(pool, server, release)
    lows = queue_in_order(
        pool, server, [(f"low{index}", {"x-priority": "low"}) for index in range(2)]
    )
    assert server.request("POST", "/?tag=low2", b"{}", {"x-priority": "low"}).status == 503
    high = send(pool, server, "high", {"x-priority": "high"})
    assert lows[1].result(30).status == 503  # the newest low call gave its place up
    release.touch()
    assert held.result(30).status == 200
    assert (high.result(30).status, lows[0].result(30).status) == (200, 200)
    assert start_order(server, ["low0", "high"]) == ["high", "low0"]
