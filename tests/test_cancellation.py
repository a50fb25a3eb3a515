"""Calls whose client leaves before the answer: each is counted once, as ``499``, in the access
log and the metrics, whichever way it came in and whatever stage it reached (issue 29)."""

from __future__ import annotations

import re

import pytest
from helpers.raw_http import chunked_post, events, get, read_until, records_of, send_and_leave
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until


@pytest.fixture
def sleeper(make_server: ServerFactory) -> RunningServer:
    return make_server("ex_sleep")


def started(server: RunningServer, tag: str) -> bool:
    return any(
        r.get("message", "").startswith(f'{{"event": "start", "tag": "{tag}"')
        for r in server.records()
    )


def counted(server: RunningServer, sample: str) -> float:
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    found = re.search(rf"^{re.escape(sample)} (\S+)$", metrics, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_running_and_a_queued_call_whose_clients_leave_are_counted_499(
    sleeper: RunningServer, way: str
):
    request = get if way == "direct" else chunked_post
    running = send_and_leave(sleeper, request("/?sleep=3&tag=running", "left-running"))
    wait_until(lambda: started(sleeper, "running"), 10, "the first call to start")
    queued = send_and_leave(sleeper, request("/?sleep=0&tag=queued", "left-queued"))
    queued.close()
    running.close()
    for request_id in ("left-running", "left-queued"):
        (record,) = wait_until(lambda r=request_id: records_of(sleeper, r), 10, request_id)
        assert record["http_status"] == 499
    assert counted(sleeper, 'abeja_runtime_requests_total{code="499"}') == 2.0
    assert counted(sleeper, 'abeja_runtime_abandoned_requests_total{stage="queued"}') == 1.0
    assert counted(sleeper, 'abeja_runtime_abandoned_requests_total{stage="running"}') == 1.0
    answer = sleeper.request("GET", "/?tag=after", headers={"x-abeja-request-id": "after"})
    assert answer.status == 200
    (record,) = wait_until(lambda: records_of(sleeper, "after"), 10, "the next call's record")
    assert record["http_status"] == 200


# --- work stopped when the client leaves ---------------------------------------------------------


@pytest.mark.parametrize(
    "handler",
    ["main:handler", "main:async_handler", "main:def_async_gen"],
    ids=["def generator", "async generator", "def handler's async generator"],
)
@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_stream_whose_client_leaves_stops_and_closes_its_generator(
    make_server: ServerFactory, handler: str, way: str
):
    server = make_server("cn_stream", "--handler", handler)
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request("/?tag=left", "stream-left"))
    assert b"left 2\n" in read_until(sock, b"left 2\n")
    sock.close()
    (closed,) = wait_until(lambda: events(server, "closed", "left"), 20, "the generator closed")
    assert closed["sent"] < 3000  # stopped, not run to its end
    # The worker is free: the next stream starts.
    sock = send_and_leave(server, request("/?tag=next", "stream-next"))
    assert b"next 0\n" in read_until(sock, b"next 0\n")
    sock.close()


@pytest.mark.parametrize(
    "handler", ["main:closes_badly", "main:async_closes_badly"], ids=["def", "async"]
)
def test_a_stream_whose_generator_fails_as_it_closes_leaves_its_process_serving(
    make_server: ServerFactory, handler: str
):
    """Its client leaves a stream (forwarded by the front: a server's first) whose generator
    raises from its ``finally``: its process ends the stream and takes the next call in its one
    slot (before, a ``def`` handler's process failed there, and exited with every call it
    ran)."""
    server = make_server("cn_stream", "--handler", handler, "--concurrency", "1")
    sock = send_and_leave(server, get("/?tag=bad", "stream-bad"))
    assert b"bad 2\n" in read_until(sock, b"bad 2\n")
    sock.close()
    wait_until(lambda: events(server, "closed", "bad"), 20, "the generator closed")
    (record,) = wait_until(lambda: records_of(server, "stream-bad"), 20, "its access record")
    assert record["http_status"] == 499
    sock = send_and_leave(server, get("/?tag=next", "stream-next"))
    try:
        assert b"next 0\n" in read_until(sock, b"next 0\n")
    finally:
        sock.close()
    assert not [r for r in server.records() if "exited" in r.get("message", "")]
    said = "cn_stream's generator fails as it closes"  # logged, not lost
    wait_until(lambda: [r for r in server.records() if said in r.get("message", "")], 10, said)


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_def_handler_sees_request_cancelled_when_its_client_leaves(
    make_server: ServerFactory, way: str
):
    server = make_server("cn_stream", "--handler", "main:watching")
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request("/?tag=w", "watched"))
    wait_until(lambda: events(server, "watching", "w"), 10, "the call to start")
    sock.close()
    wait_until(lambda: events(server, "noticed", "w"), 20, "request.cancelled to be set")
    (record,) = wait_until(lambda: records_of(server, "watched"), 10, "its access record")
    assert record["http_status"] == 499
    # The worker is free: the next call starts.
    with send_and_leave(server, request("/?tag=next", "watched-next")):
        wait_until(lambda: events(server, "watching", "next"), 10, "the next call to start")


@pytest.mark.parametrize(
    ("concurrency", "steps", "switch"),
    [("1", "1", ("--cancel-raises",)), ("2", "1200", ("--cancel-raises", "on"))],
    ids=["main thread, in one long sleep", "handler threads, between short sleeps"],
)
def test_cancel_raises_interrupts_a_def_handler_whose_client_left(
    make_server: ServerFactory, concurrency: str, steps: str, switch: tuple[str, ...]
):
    """``--cancel-raises`` (alone, or ``on`` as its variable takes it): ``CallCancelled`` is
    raised in the handler (its ``finally`` runs): on the main thread even inside a
    ``time.sleep``, on a handler thread at its next Python line; and the worker serves the
    next call."""
    server = make_server(
        "cn_stream", "--handler", "main:sleeper", *switch, "--concurrency", concurrency
    )
    sock = send_and_leave(server, get(f"/?tag=s&steps={steps}", "interrupted"))
    wait_until(lambda: events(server, "watching", "s"), 10, "the call to start")
    sock.close()
    wait_until(lambda: events(server, "finally", "s"), 20, "the handler to be interrupted")
    (record,) = wait_until(lambda: records_of(server, "interrupted"), 10, "its access record")
    assert record["http_status"] == 499
    server.wait_for_record(lambda r: "was interrupted" in r.get("message", ""))
    with send_and_leave(server, get("/?tag=next", "next")):
        wait_until(lambda: events(server, "watching", "next"), 10, "the next call to start")
