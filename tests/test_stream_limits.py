"""What bounds a stream, over real HTTP (issue 37 points 1 to 3): its own limits, never its
age nor its neighbours'.

* A stream that keeps producing outlives ``--timeout`` + ``--grace-period`` whole, and so do
  the other streams of its worker: the stuck-handler watch judges calls whose handler has not
  answered, and a stream's handler has (before, its worker was killed at that age, with every
  call it ran).
* ``--stream-timeout`` cuts a stream that lasts too long, alone: its generator is closed, its
  worker and the other streams of that worker go on.
* ``--stream-idle-timeout`` counts both ways: a client that takes nothing for as long is cut,
  its generator closed, its slot free again.
* The window is counted in bytes too, and big chunks never sit whole in the front: clients that
  open streams of 32 MiB chunks and read nothing, then leave, leave the front as it was
  (memory read through ``/proc``).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers.metrics import scrape, total
from helpers.raw_http import events, get, read_until, records_of, send_and_leave, stream_once
from helpers.servers import RunningServer, ServerFactory, front_memory_mib
from helpers.waiting import wait_until
from helpers.workers import handler_processes

MiB = 1024 * 1024


def worker_pids(server: RunningServer) -> set[int]:
    return handler_processes(server.process.pid)


def stuck_restarts(server: RunningServer) -> float:
    samples = scrape(server)
    return total(samples, "abeja_runtime_worker_restarts_total", reason="stuck")


def whole_stream(sock: socket.socket, tag: str, lines: int) -> bytes:
    """The rest of a chunked stream of ``lines`` lines, to its chunked end; the socket closed."""
    try:
        data = read_until(sock, b"0\r\n\r\n")
    finally:
        sock.close()
    assert data.endswith(b"0\r\n\r\n"), f"the stream {tag} was cut short: {data[-200:]!r}"
    assert f"{tag} {lines - 1}\n".encode() in data
    return data


@pytest.mark.parametrize("handler", ["main:handler", "main:async_handler"], ids=["def", "async"])
def test_a_stream_older_than_timeout_and_grace_goes_on_with_its_neighbours(
    make_server: ServerFactory, handler: str
):
    """Two streams of one worker, each producing a line every 20 ms for 4 s, twice
    ``--timeout 1`` + ``--grace-period 1``: both arrive whole, the worker is the same one
    (before: killed as stuck after 2 s, both streams cut), its generators end normally."""
    server = make_server(
        "cn_stream",
        "--handler", handler,
        "--concurrency", "2",
        "--timeout", "1",
        "--grace-period", "1",
    )  # fmt: skip
    workers = worker_pids(server)
    socks = [send_and_leave(server, get(f"/?lines=200&tag=long{i}", f"long{i}")) for i in (0, 1)]
    for sock in socks:
        sock.settimeout(60)
    for index, sock in enumerate(socks):
        whole_stream(sock, f"long{index}", 200)
    for index in (0, 1):
        (closed,) = wait_until(lambda i=index: events(server, "closed", f"long{i}"), 10, "closed")
        assert closed["sent"] == 200
        (record,) = wait_until(lambda i=index: records_of(server, f"long{i}"), 10, "the record")
        assert record["http_status"] == 200
    assert worker_pids(server) == workers
    assert stuck_restarts(server) == 0
    assert not [r for r in server.records() if "stuck" in r.get("message", "")]


def test_a_stream_past_its_whole_limit_is_cut_alone(make_server: ServerFactory):
    """``--stream-timeout 1``: a stream of a minute is cut short after a second, its generator
    closed, the log says why; a short stream beside it on the same worker arrives whole, and
    the worker serves on."""
    server = make_server(
        "cn_stream",
        "--handler",
        "main:async_handler",
        "--concurrency",
        "2",
        "--stream-timeout",
        "1",
    )
    workers = worker_pids(server)
    long = send_and_leave(server, get("/?tag=endless", "endless"))
    long.settimeout(30)
    short = send_and_leave(server, get("/?lines=10&tag=short", "short"))
    short.settimeout(30)
    whole_stream(short, "short", 10)
    try:
        received = read_until(long, b"0\r\n\r\n")  # until the front closes the connection
    finally:
        long.close()
    assert b"endless 0\n" in received and not received.endswith(b"0\r\n\r\n")
    (closed,) = wait_until(lambda: events(server, "closed", "endless"), 10, "the generator closed")
    assert 0 < closed["sent"] < 3000
    said = server.wait_for_record(lambda r: "lasted 1 s" in r.get("message", ""))
    assert said["log_level"] == "warning" and "(request endless)" in said["message"]
    (record,) = wait_until(lambda: records_of(server, "endless"), 10, "its access record")
    assert record["http_status"] == 504 and record["stream_end"] == "too_long"
    assert 0 < record["bytes_sent"] < len(received)
    assert worker_pids(server) == workers
    after = server.request("GET", "/?lines=3&tag=after", timeout=30)
    assert after.status == 200 and b"after 2\n" in after.body


@pytest.mark.parametrize("handler", ["main:blocks", "main:async_blocks"], ids=["def", "async"])
def test_a_client_that_takes_nothing_is_cut_at_the_idle_limit_and_frees_its_slot(
    make_server: ServerFactory, handler: str
):
    """A client that reads nothing of a stream of 4,000 chunks of 256 KiB: once the socket
    buffers and the window are full, nothing moves for ``--stream-idle-timeout 1``; the stream
    is cut, its generator closed, and the worker's only slot serves the next request (before:
    the generator waited for credit until the worker was killed as stuck)."""
    server = make_server("cn_stream", "--handler", handler, "--stream-idle-timeout", "1")
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.settimeout(30)
    reader.connect(("127.0.0.1", server.port))
    try:
        reader.sendall(get("/?chunks=4000&kib=256&tag=stalled", "stalled"))
        (closed,) = wait_until(lambda: events(server, "closed", "stalled"), 30, "the cut")
        assert closed["sent"] < 100
        said = server.wait_for_record(lambda r: "made no progress" in r.get("message", ""))
        assert "(request stalled)" in said["message"]
        (record,) = wait_until(lambda: records_of(server, "stalled"), 10, "its access record")
        assert record["http_status"] == 504 and record["stream_end"] == "idle"
        assert record["bytes_sent"] >= 256 * 1024
        after = send_and_leave(server, get("/?chunks=3&kib=1&tag=next", "next"))
        after.settimeout(30)
        try:
            assert read_until(after, b"0\r\n\r\n").endswith(b"0\r\n\r\n")
        finally:
            after.close()
    finally:
        reader.close()


@pytest.mark.parametrize(
    "handler, made", [("main:blocks", 2), ("main:async_blocks", 1)], ids=["sent", "written"]
)
def test_abandoned_streams_of_big_chunks_leave_nothing_in_the_front(
    make_server: ServerFactory, handler: str, made: int
):
    """Twice: four clients open streams of 32 MiB chunks, read nothing until each generator
    has made its second chunk, then leave. The front's peak stays far below one chunk per
    stream (a chunk above the inline limit is written from its memfd, a piece at a time), its
    memory once the streams are closed is what it was, and no stream ran more than the byte
    window ahead (before: 1,212 MiB at the peak and 1,084 MiB after they left, 2,108 MiB after
    a second round). An event-loop worker writes its streams to the clients itself (from its
    first stream on, here a small one first): each generator waits with its first chunk, which
    its client does not take, and the front holds none of it."""
    server = make_server("cn_stream", "--handler", handler, "--concurrency", "4")
    stream_once(server, "/?chunks=1&kib=1&tag=first")
    at_rest = front_memory_mib(server, "VmRSS")
    peak_before = front_memory_mib(server, "VmHWM")
    for round_ in range(2):
        tags = [f"big{round_}{index}" for index in range(4)]
        socks = []
        try:
            for tag in tags:
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.settimeout(30)
                sock.connect(("127.0.0.1", server.port))
                sock.sendall(get(f"/?chunks=6&kib=32768&say=each&tag={tag}", tag))
                socks.append(sock)
            for tag in tags:
                wait_until(
                    lambda t=tag: [e for e in events(server, "made", t) if e["sent"] >= made],
                    60,
                    f"chunk {made} of {tag}",
                )
        finally:
            for sock in socks:
                sock.close()
        for tag in tags:
            (closed,) = wait_until(lambda t=tag: events(server, "closed", t), 30, "closed")
            assert closed["sent"] <= 2, closed  # the first chunk crossed the byte window
    records = [
        record
        for tag in ("big00", "big01", "big02", "big03")
        for record in wait_until(lambda t=tag: records_of(server, t), 10, "the records")
    ]
    assert {(r["http_status"], r["stream_end"]) for r in records} == {(499, "client_left")}
    samples = scrape(server)
    left = total(samples, "abeja_runtime_abandoned_requests_total", stage="answering")
    assert left == total(samples, "abeja_runtime_requests_total", code="499") == 8
    peak = front_memory_mib(server, "VmHWM")
    assert peak < max(peak_before, at_rest) + 64, (at_rest, peak_before, peak)
    assert front_memory_mib(server, "VmRSS") < at_rest + 32


@pytest.mark.parametrize(
    "mode, status, end", [("stream_fails", 500, "failed"), ("stream_dies", 502, "worker_lost")]
)
def test_a_stream_that_breaks_after_its_head_is_recorded_by_how_it_ended(
    make_server: ServerFactory, mode: str, status: int, end: str
):
    """Its head said ``200``; its generator raised, or its worker died, after the first
    chunk: the body is cut short, and its record and ``requests_total`` say how it ended (before:
    ``200``, as if it went out whole), with the bytes it sent."""
    server = make_server("er_mixed")
    sock = send_and_leave(server, get(f"/?mode={mode}", mode))
    sock.settimeout(30)
    try:
        received = read_until(sock, b"0\r\n\r\n")  # until the front closes the connection
    finally:
        sock.close()
    assert received.startswith(b"HTTP/1.1 200 ") and not received.endswith(b"0\r\n\r\n")
    (record,) = wait_until(lambda: records_of(server, mode), 10, "its access record")
    assert record["http_status"] == status and record["stream_end"] == end
    assert record["bytes_sent"] == len(b"first")
    assert total(scrape(server), "abeja_runtime_requests_total", code=str(status)) == 1


def test_a_cut_stream_whose_generator_does_not_stop_has_its_worker_recycled(
    make_server: ServerFactory, tmp_path: Path
):
    """A ``def`` generator that waits (20 s) for a file nobody creates, past
    ``--stream-idle-timeout 1``: it is cut, and since the generator cannot be stopped before
    its next chunk, its worker is killed ``--grace-period`` after the cut and replaced, as a
    stuck handler's is (else it would hold its slot for as long as the generator waits)."""
    server = make_server(
        "cn_stream",
        "--handler", "main:held",
        "--stream-idle-timeout", "1",
        "--grace-period", "1",
    )  # fmt: skip
    (worker,) = worker_pids(server)
    sock = send_and_leave(server, get(f"/?until={tmp_path / 'never'}", "held"))
    sock.settimeout(30)
    try:
        read_until(sock, b"0\r\n\r\n")  # until the front closes the connection
    finally:
        sock.close()
    said = server.wait_for_record(lambda r: "after it was cut" in r.get("message", ""), 30)
    assert said["message"].startswith(f"a streamed answer of worker {worker} has gone on")
    wait_until(lambda: worker not in worker_pids(server), 30, "the stuck worker to be gone")
    assert stuck_restarts(server) == 1
    after = server.request("GET", f"/?until={tmp_path}", timeout=30)  # (it exists: at once)
    assert after.status == 200 and b"after the release\n" in after.body
