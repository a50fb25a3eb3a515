"""Streamed answers that an event-loop worker writes to its client itself, over real HTTP: the
front lends the connection with the call and stays off the chunks' way
(``worker/client_streams.py``), and the connection is the front's again at the stream's end.
The front lends connections once its handler has answered with a stream: each test streams
once first (:func:`lending`).
"""

from __future__ import annotations

import http.client
import os
import signal
from pathlib import Path

import pytest
from helpers.metrics import scrape, total
from helpers.raw_http import get, read_until, records_of, send_and_leave, stream_once
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until


def queued_calls(server: RunningServer) -> float:
    return total(scrape(server), "abeja_runtime_queued_requests")


def lending(server: RunningServer) -> RunningServer:
    """``server`` once it lends its connections: after its first stream (``cn_stream``'s
    ``async_handler``, or any handler that streams its ``?lines=1``)."""
    stream_once(server, "/?lines=1&tag=first")
    return server


def test_the_chunks_reach_the_client_while_the_front_is_stopped(
    make_server: ServerFactory, tmp_path: Path
):
    """The front is stopped (``SIGSTOP``) after the first chunk: the rest of the stream still
    arrives, body's end included, which only the worker can have written. Through the front,
    the test would wait for the chunks until its socket's timeout."""
    server = make_server("cn_stream", "--handler", "main:async_held")
    (tmp_path / "first").touch()  # its first stream, not held: lending begins with it
    stream_once(server, f"/?until={tmp_path / 'first'}")
    release = tmp_path / "release"
    sock = send_and_leave(server, get(f"/?until={release}", "lent"))
    try:
        assert b"before the release\n" in read_until(sock, b"before the release\n")
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            release.touch()
            rest = read_until(sock, b"0\r\n\r\n")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert b"after the release\n" in rest and rest.endswith(b"0\r\n\r\n")
    finally:
        sock.close()
    (record,) = wait_until(lambda: records_of(server, "lent"), 10, "the stream's record")
    assert record["http_status"] == 200
    assert record["stream_end"] == "complete" and record["chunks"] == 2
    assert 0 < record["time_to_first_byte_microsecs"] < record["elapsed_microsecs"]


@pytest.mark.parametrize(
    "queue", [[], ["--concurrency", "1", "--max-queue", "0"]], ids=["", "no-queue"]
)
def test_the_connection_serves_its_next_requests_after_a_written_stream(
    make_server: ServerFactory, queue: list[str]
):
    """Three streams asked at once on one connection (pipelined): each answer whole and in
    order, the next one's head after the body's end of the one before; with one slot and no
    room to wait, each next one is admitted too: the ended stream's slot is free by then."""
    server = lending(make_server("cn_stream", "--handler", "main:async_handler", *queue))
    requests = b"".join(get(f"/?lines=3&tag=p{index}", f"p{index}") for index in range(3))
    sock = send_and_leave(server, requests)
    try:
        data = b""
        while data.count(b"0\r\n\r\n") < 3:
            piece = sock.recv(65536)
            assert piece, data
            data += piece
    finally:
        sock.close()
    answers = data.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 3
    for index, answer in enumerate(answers):
        assert f"x-abeja-request-id: p{index}".encode() in answer
        assert answer.endswith(b"0\r\n\r\n")


@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "close"])
def test_a_stream_written_by_the_worker_ends_the_connection_when_asked(
    make_server: ServerFactory, close: bool
):
    """``Connection: close`` from the client: the worker's head says it, and the connection
    ends after the body's end; without it, the same connection answers the next request."""
    server = lending(make_server("cn_stream", "--handler", "main:async_handler"))
    request = get("/?lines=2&tag=c", "c")
    if close:
        request = request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    sock = send_and_leave(server, request)
    try:
        data = read_until(sock, b"0\r\n\r\n")
        assert (b"Connection: close\r\n" in data) is close
        if close:
            assert sock.recv(100) == b""  # the front's end, once the worker let it go
        else:
            sock.sendall(get("/?lines=1&tag=d", "d"))
            assert b"d 0\n" in read_until(sock, b"0\r\n\r\n")
    finally:
        sock.close()


def test_a_call_past_its_deadline_while_its_connection_is_lent_gets_its_504(
    make_server: ServerFactory,
):
    """An ``async def`` handler that blocks its worker's loop past ``--timeout`` before its
    stream: the front may not write on the connection it lent until the worker lets the call
    go, here when the worker is replaced as stuck (``--grace-period`` later). The client then
    gets the ``504``, whole, and the connection goes on."""
    server = make_server(
        "cn_stream", "--handler", "main:stalling", "--timeout", "1", "--grace-period", "1"
    )
    lending(server)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/?stall=30&lines=1", headers={"x-abeja-request-id": "late"})
        answer = connection.getresponse()
        assert answer.status == 504
        assert b"ABEJA_RUNTIME_TIMEOUT" in answer.read()
        connection.request("GET", "/health_check")  # the front answers it on this connection
        health = connection.getresponse()
        assert health.status in (200, 503)  # ready, or the stuck worker's replacement starting
        health.read()
    finally:
        connection.close()
    (record,) = wait_until(lambda: records_of(server, "late"), 10, "the call's record")
    assert record["http_status"] == 504


def test_a_written_stream_that_fails_before_its_first_chunk_sends_its_head_then_is_cut(
    make_server: ServerFactory,
):
    """The head goes with the first chunk; a generator that raises before it still gets its
    status line out, then the connection ends without the body's end, as on the front's way,
    and the record says ``500``, ``failed``."""
    server = lending(make_server("cn_stream", "--handler", "main:failing"))
    sock = send_and_leave(server, get("/?fail=1", "fails"))
    try:
        received = read_until(sock, b"0\r\n\r\n")  # until the connection ends
    finally:
        sock.close()
    assert received.startswith(b"HTTP/1.1 200 ") and not received.endswith(b"0\r\n\r\n")
    (record,) = wait_until(lambda: records_of(server, "fails"), 10, "its access record")
    assert record["http_status"] == 500 and record["stream_end"] == "failed"


def test_calls_cut_by_the_end_of_the_grace_period_each_have_their_record(
    make_server: ServerFactory, tmp_path: Path
):
    """At a stop whose grace period ends with two streams running, one written by the front and
    one by the worker, and a third call queued behind them, the worker is killed: each stream's
    record says so (``502``, ``worker_lost``), and the queued call is answered ``503``, before
    the front exits. The front once closed its connections first: the stream it wrote was
    recorded as its client's leaving (``499``), the others not at all."""
    server = make_server(
        "cn_stream", "--handler", "main:async_held", "--concurrency", "2",
        "--grace-period", "1", "--drain-delay", "0",
    )  # fmt: skip
    never = tmp_path / "never"  # the streams wait for it (20 s at most): past the stop's margin
    sockets = []
    try:
        for request_id in ("relayed", "lent"):  # the first stream is relayed: lending follows it
            sock = send_and_leave(server, get(f"/?until={never}", request_id))
            sockets.append(sock)
            assert b"before the release\n" in read_until(sock, b"before the release\n")
        queued = send_and_leave(server, get(f"/?until={never}", "queued"))
        sockets.append(queued)
        wait_until(lambda: queued_calls(server) == 1, 10, "the third call to be queued")
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) == 0
        assert read_until(queued, b"send it again").startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in sockets:
            sock.close()
    assert any("did not stop in time" in r.get("message", "") for r in server.records())
    for request_id in ("relayed", "lent"):
        (record,) = records_of(server, request_id)
        assert (record["http_status"], record["stream_end"]) == (502, "worker_lost"), record
    (record,) = records_of(server, "queued")
    assert record["http_status"] == 503
