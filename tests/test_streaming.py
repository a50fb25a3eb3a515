"""Streamed answers, over real HTTP: each chunk reaches the client as it is produced, from sync
and async generators alike, on both ways in; the access record covers the whole stream, with
the time to its first byte (issue 29 point 2).

"As it is produced" is tested without a clock: the generator's second chunk waits for a file
that the test creates only once it has read the first one. A front that held the stream back
would leave the test waiting for ever (its socket's timeout fails it instead).
"""

from __future__ import annotations

import http.client
import itertools
import socket
import time
from pathlib import Path

import pytest
from helpers.metrics import scrape
from helpers.raw_http import chunked_post, events, get, read_until, records_of, send_and_leave
from helpers.servers import RunningServer, ServerFactory, front_memory_mib
from helpers.waiting import wait_until


@pytest.mark.parametrize("handler", ["main:held", "main:async_held"], ids=["def", "async"])
@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_each_chunk_reaches_the_client_before_the_next_is_produced(
    make_server: ServerFactory, tmp_path: Path, handler: str, way: str
):
    server = make_server("cn_stream", "--handler", handler)
    release = tmp_path / "release"
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request(f"/?until={release}", "held"))
    try:
        first = read_until(sock, b"before the release\n")
        assert b"before the release\n" in first and b"after" not in first
        release.touch()
        rest = read_until(sock, b"0\r\n\r\n")  # the chunked body's end
        assert b"after the release\n" in rest
    finally:
        sock.close()
    (record,) = wait_until(lambda: records_of(server, "held"), 10, "the stream's record")
    assert record["http_status"] == 200
    # Its duration covers the whole stream: the release came after the first byte left.
    assert 0 < record["time_to_first_byte_microsecs"] < record["elapsed_microsecs"]


@pytest.mark.parametrize(
    "handler", ["main:held_items", "main:async_held_items"], ids=["def", "async"]
)
@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_each_json_line_arrives_with_its_newline_before_the_next_item_is_produced(
    make_server: ServerFactory, tmp_path: Path, handler: str, way: str
):
    """Issue 37 point 10: a reader of lines has each item as it is sent. Before, an item's
    newline went out with the next item (and the last had none): the first line never became
    whole before the release, and the test failed at its socket's timeout."""
    server = make_server("cn_stream", "--handler", handler)
    release = tmp_path / "release"
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request(f"/?until={release}", "lines"))
    try:
        first = read_until(sock, b'{"item": 0}\n')
        assert b'{"item": 0}\n' in first and b'"item": 1' not in first
        release.touch()
        rest = read_until(sock, b"0\r\n\r\n")  # the chunked body's end
    finally:
        sock.close()
    head, _, chunked = (first + rest).partition(b"\r\n\r\n")
    assert b"content-type: application/x-ndjson" in head.lower()
    assert dechunked(chunked) == b'{"item": 0}\n{"item": 1}\n'


def dechunked(data: bytes) -> bytes:
    """The body of a whole chunked answer's ``data`` (what follows its head)."""
    body = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return body
        body, data = body + data[:size], data[size + 2 :]


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_server_sent_events_arrive_one_by_one(make_server: ServerFactory, tmp_path: Path, way: str):
    server = make_server("cn_stream", "--handler", "main:events")
    release = tmp_path / "release"
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request(f"/?until={release}", "sse"))
    try:
        head_and_first = read_until(sock, b'data: {"token": "Hello"}\n\n')
        head = head_and_first.split(b"\r\n\r\n", 1)[0].decode().lower()
        assert "content-type: text/event-stream" in head
        assert "cache-control: no-cache" in head and "x-accel-buffering: no" in head
        assert b"world" not in head_and_first
        release.touch()
        rest = read_until(sock, b"data: [DONE]\n\n")
        assert b'data: {"token": "world"}\n\n' in rest
    finally:
        sock.close()


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_stream_silent_past_the_idle_limit_is_cut_short(
    make_server: ServerFactory, tmp_path: Path, way: str
):
    """``--stream-idle-timeout 1``: the generator's second chunk never comes (it waits for a
    file nobody creates); the answer is cut short (no chunked end), its call withdrawn, and
    the log says why."""
    server = make_server("cn_stream", "--handler", "main:held", "--stream-idle-timeout", "1")
    request = get if way == "direct" else chunked_post
    sock = send_and_leave(server, request(f"/?until={tmp_path / 'never'}", "silent"))
    try:
        received = read_until(sock, b"0\r\n\r\n")  # until the front closes the connection
    finally:
        sock.close()
    assert b"before the release\n" in received and not received.endswith(b"0\r\n\r\n")
    said = server.wait_for_record(lambda r: "made no progress for 1 s" in r.get("message", ""))
    assert said["log_level"] == "warning" and "(request silent)" in said["message"]


@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_slow_readers_of_big_answers_do_not_fill_the_front(make_server: ServerFactory, way: str):
    """Four clients that do not read a 64 MiB answer each: the front holds a piece of each,
    not all of it (before: it read each answer whole, 4 x 64 MiB; measured with 200 MiB
    answers, 39 -> 839 MiB, now 41 MiB). Then each client reads its answer, byte-exact."""
    server = make_server("cn_stream", "--handler", "main:big", "--concurrency", "4")
    at_rest = front_memory_mib(server)
    request = get if way == "direct" else chunked_post
    socks = []
    try:
        for index in range(4):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            sock.sendall(request(f"/?mib=64&tag=big{index}", f"big{index}"))
            socks.append(sock)
        for index, sock in enumerate(socks):  # every answer made, and its head on its way
            wait_until(lambda i=index: events(server, "answered", f"big{i}"), 20, "the answer")
            assert sock.recv(64, socket.MSG_PEEK).startswith(b"HTTP/1.1 200 ")
        assert front_memory_mib(server) < at_rest + 64  # less than one answer's worth
        expected = bytes(range(251)) * (64 * 1024 * 1024 // 251 + 1)
        for sock in socks:
            data = read_until(sock, b"\r\n\r\n")
            head, start = data.split(b"\r\n\r\n", 1)
            assert b"content-length: 67108864" in head.lower()
            body = bytearray(64 * 1024 * 1024)
            body[: len(start)] = start
            view, got = memoryview(body), len(start)
            while got < len(body):
                taken = sock.recv_into(view[got:])
                assert taken, "the answer was cut short"
                got += taken
            assert body == expected[: 64 * 1024 * 1024]
    finally:
        for sock in socks:
            sock.close()


def read_chunked_body(sock: socket.socket) -> bytes:
    """A chunked answer's whole body (bounded by the socket's timeout; cut short: fails)."""
    data = read_until(sock, b"\r\n\r\n")
    head, rest = data.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head.lower()
    body = bytearray()
    buffer = bytearray(rest)
    while True:
        while b"\r\n" not in buffer:
            more = sock.recv(1 << 20)
            assert more, "the answer was cut short"
            buffer += more
        line, _, remainder = bytes(buffer).partition(b"\r\n")
        size = int(line, 16)
        buffer = bytearray(remainder)
        while len(buffer) < size + 2:
            more = sock.recv(1 << 20)
            assert more, "the answer was cut short"
            buffer += more
        if size == 0:
            return bytes(body)
        body += buffer[:size]
        del buffer[: size + 2]


def arrives_whole(sock: socket.socket, count: int, kib: int) -> None:
    """The stream of ``count`` blocks of ``kib`` KiB on ``sock`` arrives whole, byte-exact
    (bounded by the socket's timeout); the socket is closed."""
    sock.settimeout(30)
    try:
        expected = b"".join(bytes([index % 256]) * kib * 1024 for index in range(count))
        assert read_chunked_body(sock) == expected
    finally:
        sock.close()


@pytest.mark.parametrize(
    "handler, options",
    [("main:blocks", ("--concurrency", "2")), ("main:async_blocks", ("--concurrency", "2"))],
    ids=["def-threads", "async"],
)
def test_a_slow_reader_holds_up_its_own_stream_only(
    make_server: ServerFactory, handler: str, options: tuple[str, ...]
):
    """Two streams from one handler process: a client that reads nothing holds up its own
    stream's generator (it makes a few chunks past what the socket buffers hold, not its
    4,000), and the other stream, started after it, arrives whole. Before, the front stopped
    reading the whole process once a stream ran 8 chunks ahead: the second stream waited for
    ever behind the first."""
    server = make_server("cn_stream", "--handler", handler, *options)
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(30)
    slow.connect(("127.0.0.1", server.port))
    try:
        slow.sendall(get("/?chunks=4000&kib=256&tag=slow", "slow"))
        wait_until(lambda: events(server, "ten", "slow"), 20, "the slow stream's tenth chunk")
        arrives_whole(send_and_leave(server, get("/?chunks=40&kib=256&tag=fast", "fast")), 40, 256)
    finally:
        slow.close()
    (closed,) = wait_until(lambda: events(server, "closed", "slow"), 20, "the slow one closed")
    # What the socket buffers on the way hold (a few MiB), plus the window: far from 4,000.
    assert 10 <= closed["sent"] < 100, closed


@pytest.mark.parametrize("handler", ["main:blocks", "main:async_blocks"], ids=["def", "async"])
def test_streams_that_fill_the_worker_s_socket_arrive_whole(
    make_server: ServerFactory, handler: str
):
    """Four streams at once of chunks that travel in their frames (60 KiB, under the inline
    limit), their windows together several times what the socket to the front buffers: the
    worker's writes wait for room and each stream arrives whole, byte-exact. An async worker
    reads its frames on its event loop; when that made its socket non-blocking, a full socket
    failed its writes, and the streams were cut short."""
    server = make_server("cn_stream", "--handler", handler, "--concurrency", "4")
    socks = [
        send_and_leave(server, get(f"/?chunks=120&kib=60&tag=full{index}", f"full{index}"))
        for index in range(4)
    ]
    for sock in socks:
        arrives_whole(sock, 120, 60)


def test_a_stream_on_the_thread_that_reads_the_frames_gets_its_credit(make_server: ServerFactory):
    """A ``def`` handler at ``--concurrency 1`` runs on the thread that reads the frames: its
    stream, 25 times the window, reads its own credit while it waits (or it would wait for
    ever), and arrives whole."""
    server = make_server("cn_stream", "--handler", "main:blocks")
    arrives_whole(send_and_leave(server, get("/?chunks=200&kib=64&tag=long", "long")), 200, 64)
    (closed,) = wait_until(lambda: events(server, "closed", "long"), 20, "the stream's end")
    assert closed["sent"] == 200


def _cumulative(server: RunningServer, name: str) -> list[tuple[float, float]]:
    """Histogram ``name``'s cumulative counts, by bucket (its upper bound)."""
    return sorted(
        (float(dict(labels)["le"]), count)
        for (sample, labels), count in scrape(server).items()
        if sample == f"{name}_bucket"
    )


def _counted(
    server: RunningServer, name: str, before: dict[str, list[tuple[float, float]]]
) -> tuple[list[float], list[float]]:
    """Histogram ``name``'s buckets (their upper bounds), and the bound of each observation's
    bucket since ``before`` (from ``/metrics``' cumulative counts)."""
    earlier = dict(before.get(name, []))
    cumulative = [
        (bound, count - earlier.get(bound, 0)) for bound, count in _cumulative(server, name)
    ]
    found, below = [], 0.0
    for bound, count in cumulative:
        found += [bound] * int(count - below)
        below = count
    return [bound for bound, _ in cumulative], found


def _same_bucket_or_next(
    measured: list[float],
    server: RunningServer,
    name: str,
    before: dict[str, list[tuple[float, float]]],
) -> None:
    """Each of the client's ``measured`` seconds falls in the bucket the runtime counted (since
    ``before``), or one beside it (the two see a chunk a moment apart)."""
    bounds, counted = _counted(server, name, before)

    def index(seconds: float) -> int:
        return next(i for i, bound in enumerate(bounds) if seconds <= bound)

    assert len(measured) == len(counted), (measured, counted)
    for seen, bound in zip(sorted(measured), sorted(counted), strict=True):
        assert abs(index(seen) - bounds.index(bound)) <= 1, (measured, counted)


@pytest.mark.parametrize(
    "handler", ["main:handler", "main:async_handler"], ids=["def", "async-written"]
)
@pytest.mark.parametrize("way", ["direct", "aiohttp"])
def test_a_stream_s_chunks_are_counted_and_timed_as_its_client_sees_them(
    make_server: ServerFactory, way: str, handler: str
):
    """The time to the first chunk and between chunks in ``/metrics`` match what the client
    measured, within one bucket; the access record counts the chunks. Each chunk comes 0.3 s
    after the one before (the first after the request), where a bucket is wider than what the
    client's own sending and reading add on a loaded machine. An ``async def`` handler's
    stream on the direct path is written by its worker (from its second stream on), which says
    what it wrote."""
    server = make_server("ex_stream", "--handler", handler)
    first = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    first.request("GET", "/?chunks=0&pause=0")  # a first stream: the front lends from then on
    assert first.getresponse().read().startswith(b" begin ")
    first.close()
    names = ("abeja_runtime_time_to_first_chunk_seconds", "abeja_runtime_inter_chunk_seconds")
    before = {name: _cumulative(server, name) for name in names}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    path, headers = "/?chunks=4&pause=0.3&first=0.3", {"X-Abeja-Request-Id": "timed"}
    sent = time.monotonic()
    if way == "direct":
        connection.request("GET", path, headers=headers)
    else:  # a chunked body goes through aiohttp's request handling
        connection.request("POST", path, body=iter([b"{}"]), headers=headers)
    answer = connection.getresponse()
    arrivals = []
    while answer.readline():
        arrivals.append(time.monotonic())
    connection.close()
    assert len(arrivals) == 5  # "begin", then 4 lines
    # Counted once the stream is over in the front: a stream its worker wrote, once its End
    # came, which may be after the client has the last chunk. The record is written then.
    (record,) = wait_until(lambda: records_of(server, "timed"), 10, "the stream's record")
    assert record["chunks"] == 5 and record["stream_end"] == "complete"
    _same_bucket_or_next([arrivals[0] - sent], server, names[0], before)
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    _same_bucket_or_next(gaps, server, names[1], before)


@pytest.mark.parametrize("handler", ["main:handler", "main:async_handler"])
def test_an_http_1_0_client_gets_its_stream_unchunked_up_to_the_close(
    make_server: ServerFactory, handler: str
):
    """HTTP/1.0 has no chunked framing (nginx's default upstream protocol): the stream's body
    is written as it comes and ends with the connection. The front once asked for chunks there,
    which aiohttp refuses: the client got no byte, and the record said 500."""
    server = make_server("cn_stream", "--handler", handler)
    request = b"GET /?lines=3&tag=old HTTP/1.0\r\nHost: x\r\nx-abeja-request-id: old\r\n\r\n"
    sock = send_and_leave(server, request)
    try:
        answer = read_until(sock, b"\0")  # (never sent: read up to the close)
    finally:
        sock.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0], answer
    assert b"chunked" not in head.lower()
    assert body == b"old 0\n\nold 1\n\nold 2\n\n"  # each text item with a newline of its own
    (record,) = wait_until(lambda: records_of(server, "old"), 10, "the stream's record")
    assert (record["http_status"], record["stream_end"]) == (200, "complete")
