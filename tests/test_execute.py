"""Handler execution through a real server: concurrency slots, the queue, timeouts, keep-alive.

Contract A1 (handler execution, keep-alive) and A2 (504, and the slot a timed-out sync handler
keeps).
The handlers record ``time.monotonic()`` themselves (one clock for every process on the machine),
so overlap and ordering are checked on the handler's own timestamps, not on client timing. A call
that must still be running when something else happens waits for a file that the test creates
(``?until=``): the test, not the clock, decides when it ends.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import itertools
import json
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pytest
from helpers.servers import TIMED_OUT_AFTER_1_S, Response, RunningServer, call_all
from helpers.waiting import wait_until

SYNC, ASYNC = "main:handler", "main:async_handler"
BOTH_KINDS = pytest.mark.parametrize("handler", [SYNC, ASYNC], ids=["sync", "async"])


def overlaps(intervals: list[tuple[float, float]]) -> bool:
    ordered = sorted(intervals)
    return any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ordered))


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:  # at equal times an end (-1) sorts first: touching is not overlapping
        running += step
        peak = max(peak, running)
    return peak


def events(server: RunningServer, tag: str) -> dict[str, float]:
    """When the ex_sleep call ``tag`` printed ``start``, ``end`` or ``cancelled``."""
    found = {}
    for record in server.records():
        message = record.get("message", "")
        if message.startswith('{"event"'):
            event = json.loads(message)
            if event["tag"] == tag:
                found[event["event"]] = event["t"]
    return found


def wait_for_event(server: RunningServer, tag: str, event: str, timeout: float = 10.0) -> float:
    return wait_until(lambda: events(server, tag).get(event), timeout, f"{event} of call {tag}")


def queued(server: RunningServer) -> float:
    """The calls waiting for a handler slot, as ``/metrics`` counts them."""
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    for line in metrics.splitlines():
        if line.startswith("abeja_runtime_queued_requests "):
            return float(line.split()[1])
    raise AssertionError("no queued gauge in /metrics")


class Held:
    """Calls with ``?{held.query}`` run until :meth:`release`: ``ex_sleep`` waits for the file
    (at most 60 s, longer than any client here waits)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self.query = f"until={quote(str(path))}"

    def release(self) -> None:
        self._path.touch()


@contextlib.contextmanager
def held_calls(tmp_path: Path) -> Iterator[Held]:
    """Released on the way out, whatever happened, so that no call is left waiting for the
    test (list it after a thread pool: it is left first)."""
    held = Held(tmp_path / "release")
    try:
        yield held
    finally:
        held.release()


# --- concurrency -------------------------------------------------------------------------------


@BOTH_KINDS
def test_calls_never_overlap_by_default(start, handler):
    server = start("ex_sleep", "--handler", handler)

    answers = call_all(server, [f"/?tag=c{i}&sleep=0.3" for i in range(4)])

    assert [answer.status for answer in answers] == [200] * 4
    intervals = [(answer.json()["start"], answer.json()["end"]) for answer in answers]
    assert not overlaps(intervals), f"calls ran at the same time: {sorted(intervals)}"


@pytest.mark.parametrize(
    ("flags", "env"),
    [(("--concurrency", "2"), {}), ((), {"ABEJA_RUNTIME_CONCURRENCY": "2"})],
    ids=["flag", "env"],
)
@BOTH_KINDS
def test_concurrency_2_lets_two_calls_overlap(start, handler, flags, env):
    server = start("ex_sleep", "--handler", handler, *flags, env=env)

    answers = call_all(server, [f"/?tag=c{i}&sleep=0.5" for i in range(4)])

    assert [answer.status for answer in answers] == [200] * 4
    intervals = [(answer.json()["start"], answer.json()["end"]) for answer in answers]
    assert most_at_once(intervals) == 2, sorted(intervals)


# --- the queue ---------------------------------------------------------------------------------


def test_full_queue_answers_503_busy_with_retry_after(start, tmp_path):
    server = start("ex_sleep", "--max-queue", "1")
    with ThreadPoolExecutor(3) as pool, held_calls(tmp_path) as held:
        running = pool.submit(server.request, "GET", f"/?tag=running&{held.query}", timeout=30)
        wait_for_event(server, "running", "start")
        # While "running" is held, one of these two waits in the queue and the other is refused:
        # the refusal is the first answer (the queued one waits for the release).
        calls = [
            pool.submit(server.request, "GET", path, timeout=30) for path in ("/?tag=b", "/?tag=c")
        ]
        wait_until(lambda: any(call.done() for call in calls), 30, "the refusal")
        held.release()
        first = running.result()
        others = [call.result() for call in calls]

    assert first.status == 200
    assert sorted(answer.status for answer in others) == [200, 503]
    busy = next(answer for answer in others if answer.status == 503)
    assert busy.json() == {"status": "service busy"}
    assert busy.headers["Content-Type"] == "application/json"
    assert int(busy.headers["Retry-After"]) >= 1
    served = next(answer for answer in others if answer.status == 200)
    assert served.json()["start"] >= first.json()["end"]  # it waited for the slot, then ran
    assert server.request("GET", "/?tag=after").status == 200


def test_a_full_queue_refuses_a_big_body_before_reading_it(start, tmp_path):
    """A request the queue cannot take is answered 503 at once: the front does not read a body
    it would only refuse (a burst of big uploads used to be read whole, then refused)."""
    server = start("ex_sleep", "--max-queue", "0", "--request-head-timeout", "30")
    with ThreadPoolExecutor(1) as pool, held_calls(tmp_path) as held:
        running = pool.submit(server.request, "GET", f"/?tag=running&{held.query}", timeout=30)
        wait_for_event(server, "running", "start")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            client.sendall(
                b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                b"Content-Length: 1048576\r\n\r\n"  # and no byte of the body
            )
            # While "running" is held; socket.timeout (a failure) if the front waits for the
            # body, which it would until the 30 s head timeout.
            head = client.recv(4096)
        held.release()
        assert running.result().status == 200
    assert head.startswith(b"HTTP/1.1 503 "), head
    assert b"Retry-After: " in head


def test_many_big_bodies_at_once_all_get_their_answer(start):
    """More bodies above the inline limit than the front reads at a time (5 for one process):
    the others wait their turn unread, and every one is answered with its own bytes."""
    server = start("rq_echo", "--workers", "1")
    bodies = [bytes([n]) * (100 * 1024 + n) for n in range(40)]
    headers = {"Content-Type": "application/octet-stream"}
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(
            pool.map(lambda body: server.request("POST", "/", body, headers, timeout=30), bodies)
        )
    assert [answer.status for answer in answers] == [200] * len(bodies)
    echoed = [base64.b64decode(answer.json()["contents"][0]["body"]) for answer in answers]
    assert echoed == bodies


#: The bodies the front reads at a time for one process: its slot and 4 ahead.
PLACES = 5


@contextlib.contextmanager
def every_body_place_held(server: RunningServer) -> Iterator[list[socket.socket]]:
    """A connection for each place each sends a part of a 1 MiB body, and stops: the front
    holds a place for each, waiting for the rest. The connections are closed on the way out,
    whatever happened."""
    with contextlib.ExitStack() as stack:
        held = []
        for _ in range(PLACES):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port), 10))
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
            sock.sendall(b"x" * 100_000)
            held.append(sock)
        wait_until(lambda: server.in_flight() == PLACES, 10, "the bodies to hold every place")
        yield held


def test_held_places_come_free_at_their_holders_deadline(start):
    """Bodies that trickle in hold their places until the request's deadline, not longer: they
    get 408 then, and a body waiting in line is read and answered: 200, or, when its own
    deadline (a little later) passes too, 408 while its body is read or 504 once its call is."""
    server = start("rq_echo", "--timeout", "2", "--request-head-timeout", "30")
    body = b"y" * (1024 * 1024)
    with every_body_place_held(server) as held:
        answer = server.request("POST", "/", body, timeout=10)
        replies = [sock.makefile("rb").read() for sock in held]  # to each connection's end
    assert answer.status in (200, 408, 504), answer
    for reply in replies:
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert b"not received within the request's deadline of 2 s" in reply
    assert server.request("POST", "/", body, timeout=10).status == 200


def test_a_client_that_leaves_while_its_body_waits_for_a_place_holds_nothing(start):
    """The front reads nothing of a waiting body (it stays in the socket): a client that
    leaves meanwhile is seen when its turn comes, and its request then ends at once."""
    server = start("rq_echo", "--request-head-timeout", "30")
    with (  # the client leaves (its connection closes) first, then the holders
        every_body_place_held(server),
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as client,
    ):
        client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        client.sendall(b"z" * 100_000)
        wait_until(lambda: server.in_flight() == PLACES + 1, 10, "the request to wait its turn")
    wait_until(lambda: server.in_flight() == 0, 10, "every request to stop counting")
    body = bytes(range(256)) * 4096
    answer = server.request("POST", "/", body, timeout=10)
    assert answer.status == 200
    assert base64.b64decode(answer.json()["contents"][0]["body"]) == body


# --- timeouts ----------------------------------------------------------------------------------


@BOTH_KINDS
def test_timeout_answers_504_at_once_and_the_server_stays_up(start, tmp_path, handler):
    server = start("ex_sleep", "--handler", handler, "--timeout", "1")

    with held_calls(tmp_path) as held:
        # The call cannot end before the test releases it (nor, by itself, within the client's
        # 30 s): its 504 comes from the deadline, while the handler still runs.
        answer = server.request("GET", f"/?tag=slow&{held.query}", timeout=30)

    assert answer.status == 504
    assert answer.json() == TIMED_OUT_AFTER_1_S
    assert answer.headers["Content-Type"] == "application/json"
    # A sync handler holds its slot until it returns: let it, so the next call is not queued.
    wait_until(lambda: {"end", "cancelled"} & events(server, "slow").keys(), 10, "slow to finish")
    assert server.request("GET", "/?tag=next", timeout=10).status == 200
    assert server.health() == 200


def test_timed_out_sync_handler_keeps_its_slot_until_it_returns(start, tmp_path):
    server = start("ex_sleep", "--timeout", "3")

    with ThreadPoolExecutor(1) as pool, held_calls(tmp_path) as held:
        timed_out = server.request("GET", f"/?tag=slow&{held.query}", timeout=30)
        following = pool.submit(server.request, "GET", "/?tag=next", timeout=30)
        # "next" has arrived while "slow" still runs (it can only end once released); then
        # "slow" is let go, within next's deadline.
        wait_until(lambda: queued(server) == 1, 10, "the next call to wait for the slot")
        held.release()
        answer = following.result()

    assert timed_out.status == 504
    assert answer.status == 200
    slow_end = wait_for_event(server, "slow", "end")
    assert answer.json()["start"] >= slow_end, "the next call ran while the timed-out one still ran"


def test_timed_out_async_handler_frees_its_slot_at_once(start, tmp_path):
    server = start("ex_sleep", "--handler", ASYNC, "--timeout", "1")

    with held_calls(tmp_path) as held:
        timed_out = server.request("GET", f"/?tag=slow&{held.query}", timeout=30)
        # Had "slow" kept its slot, "next" would wait for a release that only comes after it,
        # and get its own 504 at its 1 s deadline.
        answer = server.request("GET", "/?tag=next", timeout=30)

    assert timed_out.status == 504
    assert timed_out.json() == TIMED_OUT_AFTER_1_S
    assert answer.status == 200
    cancelled = wait_for_event(server, "slow", "cancelled")  # not left running in the background
    assert answer.json()["start"] >= cancelled
    assert "end" not in events(server, "slow")


# --- streamed responses ------------------------------------------------------------------------


def stream_interval(answer: Response, tag: str) -> tuple[float, float]:
    lines = answer.body.decode().splitlines()
    steps = [line.split()[:2] for line in lines]
    assert steps == [[tag, step] for step in ("begin", "0", "1", "2")]
    return float(lines[0].split()[2]), float(lines[-1].split()[2])


@BOTH_KINDS
def test_streamed_generators_hold_the_slot_until_the_last_chunk(start, handler):
    server = start("ex_stream", "--handler", handler)

    answers = call_all(server, [f"/?tag=s{i}&chunks=3&pause=0.1" for i in range(3)])

    assert [answer.status for answer in answers] == [200] * 3
    assert all(answer.headers["Transfer-Encoding"] == "chunked" for answer in answers)
    intervals = [stream_interval(answer, f"s{i}") for i, answer in enumerate(answers)]
    assert not overlaps(intervals), f"streams were produced at the same time: {sorted(intervals)}"


# --- exceptions --------------------------------------------------------------------------------


@BOTH_KINDS
def test_handler_exception_answers_500_and_the_next_request_succeeds(start, handler):
    server = start("ex_sleep", "--handler", handler)

    failed = server.request("GET", "/?tag=bad&raise=1")
    answer = server.request("GET", "/?tag=good")

    assert failed.status == 500
    assert failed.json() == {"status": "unexpected error occurred"}
    assert failed.headers["Content-Type"] == "application/json"
    assert answer.status == 200
    assert answer.json()["tag"] == "good"
    record = server.wait_for_record(lambda r: "ex_sleep was asked to fail (bad)" in str(r))
    assert record["log_level"] == "error"
    assert record["request_id"] == failed.headers["x-abeja-request-id"]


# --- keep-alive --------------------------------------------------------------------------------

MULTIPART_WITHOUT_BOUNDARY = {"Content-Type": "multipart/form-data"}

#: (method, path, body, headers, expected status), sent in this order on one connection.
KEEP_ALIVE_SEQUENCE = [
    ("GET", "/?tag=k1", None, {}, 200),
    ("OPTIONS", "/", None, {}, 405),
    ("HEAD", "/", None, {}, 405),
    ("GET", "/?tag=k2&raise=1", None, {}, 500),
    ("POST", "/?tag=k3", b'{"a": 1}', {"Content-Type": "application/json"}, 200),
    ("POST", "/?tag=k4", b"--x\r\n\r\n", MULTIPART_WITHOUT_BOUNDARY, 400),
    ("GET", "/?tag=k5&q=%ff", None, {}, 400),
    ("GET", "/?tag=k6&{until}", None, {}, 504),  # held until its 504 has come
    ("GET", "/health_check", None, {}, 200),
    ("PUT", "/?tag=k7", b"raw", {"Content-Type": "application/octet-stream"}, 200),
]


def test_keep_alive_serves_every_response_on_one_connection(start, tmp_path):
    server = start("ex_sleep", "--timeout", "1")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.connect()
        sock = connection.sock
        statuses = []
        with held_calls(tmp_path) as held:
            for method, path, body, headers, _ in KEEP_ALIVE_SEQUENCE:
                connection.request(
                    method, path.format(until=held.query), body=body, headers=headers
                )
                answer = connection.getresponse()
                answer.read()
                statuses.append(answer.status)
                if "{until}" in path:
                    held.release()  # its slot comes free for the calls after it
            assert not answer.will_close, f"{method} {path} ({answer.status}) closed the connection"
            assert connection.sock is sock, f"{method} {path} needed a new connection"
    finally:
        connection.close()

    assert statuses == [expected for *_, expected in KEEP_ALIVE_SEQUENCE]


def test_keep_alive_connections_are_served_side_by_side(start):
    """No single-connection limit: requests alternate between two connections that stay open."""
    server = start("ex_sleep")
    connections = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in "ab"]
    try:
        for round_ in range(3):
            for name, connection in zip("ab", connections, strict=True):
                connection.request("GET", f"/?tag={name}{round_}")
                answer = connection.getresponse()
                assert answer.status == 200
                assert json.loads(answer.read())["tag"] == f"{name}{round_}"
                assert not answer.will_close
    finally:
        for connection in connections:
            connection.close()
