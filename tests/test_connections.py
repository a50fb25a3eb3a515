"""Connection limits over raw sockets: a refused body is not read, slow heads and idle
connections are cut off, and health stays fast meanwhile (issue 8, points 6 and 7).

No assertion times the server: the answers say which limit cut a connection off, and a socket
timeout (30 s, past every limit set here) only keeps a hang from hanging the test.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import http.client
import json
import os
import resource
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.servers import HANDLERS, RunningServer, ServerFactory, runtime_env
from helpers.waiting import wait_until

from abeja_runtime.launch import RuntimeProcess, free_ports, runtime_command

MiB = 1024 * 1024


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def read_until_closed(sock: socket.socket, limit: int = 65536) -> bytes:
    """What the server sends until it closes the connection (bounded by the socket timeout)."""
    data = b""
    while len(data) < limit:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def send_until_answered(sock: socket.socket, size: int, *, chunked: bool) -> tuple[bool, int]:
    """Send a body of ``size`` bytes (headers already sent) until the server answers, like
    curl (an early answer stops the upload), for 30 s at most: (answered, bytes sent)."""
    block = b"x" * MiB
    if chunked:
        block = f"{len(block):x}\r\n".encode() + block + b"\r\n"
    sent = 0
    deadline = time.monotonic() + 30
    answered = False
    sock.setblocking(False)
    while sent < size and time.monotonic() < deadline:
        readable, writable, _ = select.select([sock], [sock], [], 1.0)
        if readable:
            answered = True
            break
        if writable:
            try:
                sent += sock.send(block)
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    sock.setblocking(True)
    sock.settimeout(10)
    return answered, sent


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_refused_body_is_answered_413_and_not_read(make_server: ServerFactory, framing: str):
    """A fast client that keeps sending 2 GiB gets its 413; the server takes in a few MiB."""
    server = make_server("ld_sync", "--max-body-size", "1MiB")
    size = 2 * 1024 * MiB
    length = (
        f"Content-Length: {size}" if framing == "content-length" else "Transfer-Encoding: chunked"
    )
    sock = connect(server)
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n{length}"
    sock.sendall(head.encode() + b"\r\n\r\n")
    answered, sent = send_until_answered(sock, size, chunked=framing == "chunked")
    answer = read_until_closed(sock)
    sock.close()

    assert answered, f"no answer while sending; sent {sent / MiB:.0f} MiB"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"request body too large' in answer
    assert sent < 64 * MiB, f"the server took in {sent / MiB:.0f} MiB after refusing the body"
    assert server.request("GET", "/").status == 200  # and it stays up


def test_a_slow_request_head_gets_408_and_health_stays_fast(make_server: ServerFactory):
    # 8 s: the health checks below happen long before any head can time out, however slow the
    # machine; the test waits that long for the 408s.
    server = make_server("ld_sync", "--request-head-timeout", "8")
    tricklers = []
    for _ in range(200):
        sock = connect(server)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        tricklers.append(sock)
    silent = connect(server)  # a connection that never sends anything
    for round_ in range(3):  # keep trickling: one header byte per socket per round
        for sock in tricklers:
            with contextlib.suppress(OSError):  # one cut off already is reported below
                sock.sendall(b"X")
        assert server.health() == 200
        assert server.request("GET", "/").status == 200
        # Answered while every slow head is still held open, unanswered: service and health
        # do not wait for them to be cut off.
        answered = select.select([*tricklers, silent], [], [], 0)[0]
        assert answered == [], f"round {round_}: {len(answered)} slow heads were cut off first"

    answers = [read_until_closed(sock) for sock in tricklers]
    for sock in tricklers:
        sock.close()
    assert all(a.startswith(b"HTTP/1.1 408 Request Timeout") for a in answers), answers[0][:200]
    assert b'"request head not received in time"' in answers[0]
    assert read_until_closed(silent) == b""  # closed without an answer: it asked nothing
    silent.close()
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
    assert b'abeja_runtime_rejected_heads_total{reason="timeout"} 200.0' in metrics


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(make_server: ServerFactory):
    server = make_server("ld_sync", "--keepalive-timeout", "1")
    sock = connect(server)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b"connection: close" not in first.lower()  # kept alive after its answer
    # The server closes it, nothing more sent, before the socket's 30 s (the default
    # keep-alive timeout is 75 s).
    assert read_until_closed(sock) == b""
    sock.close()


def test_connection_timeouts_are_validated(make_server: ServerFactory):
    server = make_server("ld_sync", "--keepalive-timeout", "0", wait=False)
    assert server.wait_exit() == 2
    wait_until(lambda: any("keepalive-timeout" in line for line in server.lines), 5, "the error")


@pytest.mark.parametrize("framing", ["content-length", "chunked", "1 MiB"])
def test_a_body_that_stops_arriving_gets_408_and_is_counted(
    make_server: ServerFactory, framing: str
):
    """Headers, a part of the body, then nothing: the body's reading fails after the head
    timeout without progress (aiohttp alone waits for ever), the client is told, the
    connection closed, the answer counted; the server stays up."""
    server = make_server("ld_sync", "--request-head-timeout", "1")
    sock = connect(server)
    if framing == "content-length":
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
    elif framing == "1 MiB":  # read from the socket into a shared buffer, past the parser
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
        sock.sendall(b"x" * 300_000)
    else:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\na\r\n")
        sock.sendall(b"x" * 10 + b"\r\n")
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b'"request body made no progress for 1 s; the limit is' in answer
    assert server.request("GET", "/").status == 200
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
    assert b'abeja_runtime_requests_total{code="408"} 1.0' in metrics
    assert server.wait_for_record(lambda r: r.get("http_status") == 408)


@pytest.mark.parametrize("limit", ["--timeout", "the caller's"])
@pytest.mark.parametrize("framing", ["1 MiB", "chunked"])
def test_a_body_still_trickling_in_at_the_deadline_gets_408(
    make_server: ServerFactory, framing: str, limit: str
):
    """A client that sends a byte now and then keeps clear of the progress timeout, not of
    the request's deadline (``--timeout``'s, or a nearer one its caller gave): its body's
    reading ends there with a 408, and the connection is closed (its place is then free for a
    body that may yet be answered in time)."""
    callers = limit == "the caller's"
    timeout = "60" if callers else "1"
    server = make_server("rq_echo", "--timeout", timeout, "--request-head-timeout", "5")
    given = b"Request-Timeout: 1\r\n" if callers else b""
    sock = connect(server)
    if framing == "1 MiB":  # read from the socket into a shared buffer, past the parser
        sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n" + given + b"\r\n")
        sock.sendall(b"x" * 100_000)
        byte = b"x"
    else:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" + given + b"\r\n"
        )
        byte = b"1\r\nx\r\n"
    # The client's pace (what is tested): a byte every 0.3 s until the answer comes, 9 s at
    # most. The answer says which limit ended it: the 1 s deadline, not the 5 s progress one.
    for _ in range(30):
        if select.select([sock], [], [], 0.3)[0]:
            break
        sock.sendall(byte)
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"not received within the request's deadline of 1 s" in answer
    assert (b"the limit is the deadline its caller gave" in answer) is callers, answer[-300:]
    body = bytes(range(256)) * 4096
    answer = server.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
    assert answer.status == 200


def test_a_big_body_waiting_for_a_place_gets_504_at_its_callers_deadline(
    make_server: ServerFactory,
):
    """Every body's place held by stalled bodies (5 for one process), a sixth whose caller gave
    1 s waits in line for that long at most: its 504 says why, its connection closes."""
    server = make_server("rq_echo", "--request-head-timeout", "30")
    head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n"
    with contextlib.ExitStack() as stack:
        for _ in range(5):
            holder = stack.enter_context(connect(server))
            holder.sendall(head + b"\r\n" + b"x" * 100_000)
        wait_until(lambda: server.in_flight() == 5, 30, "five bodies to hold the places")
        waiting = stack.enter_context(connect(server))
        waiting.sendall(head + b"Request-Timeout: 1\r\n\r\n" + b"x" * 100_000)
        answer = read_until_closed(waiting)
    assert answer.startswith(b"HTTP/1.1 504 "), answer[:200]
    assert b"the caller's deadline gave" in answer, answer[-300:]
    record = server.wait_for_record(lambda r: r.get("http_status") == 504)
    assert record["deadline"] == 1


def test_stalled_big_bodies_give_their_places_back(make_server: ServerFactory):
    """More stalled 1 MiB bodies than the front reads at a time (5 for one process): each gets
    its 408 (those that waited for a place once one is given back), and a big body is served
    after them."""
    server = make_server("rq_echo", "--request-head-timeout", "1")
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(connect(server)) for _ in range(8)]
        for sock in socks:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n")
            sock.sendall(b"x" * 100_000)
        answers = [read_until_closed(sock) for sock in socks]
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers
    body = bytes(range(256)) * 4096
    answer = server.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
    assert answer.status == 200
    assert base64.b64decode(answer.json()["contents"][0]["body"]) == body


def test_garbage_after_a_big_body_gets_400_after_the_body_s_answer(make_server: ServerFactory):
    """The parser that starts afresh after a body read from the socket refuses what follows
    it as any other: the request before is answered, then the garbage gets its 400 and the
    connection is closed."""
    server = make_server("rq_echo")
    body = b"z" * (1024 * 1024)
    sock = connect(server)
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
        + b"NOT HTTP AT ALL\r\n\r\n"
    )
    answers = read_until_closed(sock, limit=4 * len(body))
    sock.close()
    first, _, rest = answers.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 "), answers[:200]
    assert b" 400 Bad Request\r\n" in rest, rest[-400:]
    assert b'"malformed HTTP request: ' in rest
    assert server.request("GET", "/").status == 200


def test_a_big_body_sent_after_100_continue_is_read(make_server: ServerFactory):
    """A client that waits for ``100 Continue`` before it sends its body gets it, then its
    answer (such a body is left to aiohttp's request handling)."""
    server = make_server("rq_echo")
    body = bytes(range(256)) * 1024  # 256 KiB
    sock = connect(server)
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        + f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    reader = sock.makefile("rb")
    assert reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    assert reader.readline() == b"\r\n"
    sock.sendall(body)
    answer = http.client.HTTPResponse(sock)
    answer.fp = reader  # what is buffered already belongs to the answer
    answer.begin()
    echoed = json.loads(answer.read())["contents"][0]["body"]
    sock.close()
    assert answer.status == 200
    assert base64.b64decode(echoed) == body


def test_a_compressed_big_body_reaches_the_handler_decompressed(make_server: ServerFactory):
    """``Content-Encoding: gzip`` is undone before the handler sees the body, whatever its
    size (a body above 64 KiB is left to aiohttp's request handling, which decompresses)."""
    server = make_server("rq_echo")
    body = os.urandom(300 * 1024)  # does not compress: the request's body stays above 64 KiB
    headers = {"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}
    answer = server.request("POST", "/", gzip.compress(body), headers)
    assert answer.status == 200
    assert base64.b64decode(answer.json()["contents"][0]["body"]) == body


def test_a_trickling_body_that_keeps_making_progress_is_read(make_server: ServerFactory):
    server = make_server("rq_echo", "--request-head-timeout", "1")
    sock = connect(server)
    body = b"abcdefghij"
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}"
    sock.sendall(head.encode() + b"\r\n\r\n")
    for byte in body:  # 2 s in all, never 1 s without a byte (5 times the pace)
        sock.sendall(bytes([byte]))
        time.sleep(0.2)  # the client's pace (what is tested), not a wait for the server
    answer = read_until_closed(sock, limit=20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a disk that a request body fills (root, and a system that lets it mount)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (root and mount rights needed): "
                    f"{mounted.stderr.strip()}")  # fmt: skip
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_while_spooling_is_a_counted_507(make_server: ServerFactory, small_disk):
    server = make_server("ld_sync", env={"TMPDIR": str(small_disk)})
    sock = connect(server)
    # Above the 1 MiB spool threshold: to the disk, which holds 2. Far more than the socket
    # buffers take (loopback grows them to several MiB), so the answer comes while it sends.
    size = 64 * MiB
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    sock.sendall(head.encode())
    answered, _ = send_until_answered(sock, size, chunked=False)
    answer = read_until_closed(sock)
    sock.close()
    assert answered and answer.startswith(b"HTTP/1.1 507 "), answer[:200]
    assert b'"no space left on the device to hold the request body' in answer
    assert server.request("GET", "/").status == 200
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body
    assert b'abeja_runtime_requests_total{code="507"} 1.0' in metrics
    assert server.wait_for_record(lambda r: r.get("http_status") == 507)
    assert list(small_disk.iterdir()) and not list(
        small_disk.glob("abeja-runtime-*/abeja-request-*")
    )


def test_idle_connections_never_take_the_health_port_s_descriptors(tmp_path: Path):
    """At ``ulimit -n 256``, 400 idle connections on the service port took every descriptor
    and ``/livez`` failed (issue 28 point 10): past the cap they are answered 503 and closed."""

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    port, health = free_ports(2)
    lines: list[str] = []
    runtime = RuntimeProcess(
        runtime_command(
            "--host", "127.0.0.1", "--port", str(port), "--healthcheck-port", str(health)
        ),
        cwd=HANDLERS / "rq_echo",
        env=runtime_env(TMPDIR=str(tmp_path)),
        on_line=lines.append,
        preexec_fn=low_limit,
    )
    runtime.port, runtime.healthcheck_port = port, health
    held: list[socket.socket] = []
    try:
        runtime.wait_healthy(20)
        for _ in range(400):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.setblocking(False)
            held.append(sock)

        def refused() -> int:
            """Those past the cap, answered and closed as the front took them (the kernel held
            all 400 for it: its backlog is 2048)."""
            count = 0
            for sock in held:
                with contextlib.suppress(BlockingIOError):
                    count += sock.recv(4096, socket.MSG_PEEK).startswith(b"HTTP/1.1 503 ")
            return count

        wait_until(lambda: refused() > 0, 10, "the connections past the cap to be answered 503")
        livez = http.client.HTTPConnection("127.0.0.1", health, timeout=10)
        livez.request("GET", "/livez")
        assert livez.getresponse().status == 200
        livez.close()
        assert 0 < refused() < 400
        for sock in held:
            sock.close()
        held.clear()
        answer = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            wait_until(lambda: _served(answer), 10, "the service to take connections again")
        finally:
            answer.close()
        assert any("connections open" in line for line in lines)
    finally:
        for sock in held:
            sock.close()
        runtime.popen.terminate()
        runtime.popen.wait(20)


def test_big_answers_held_by_slow_readers_count_against_the_connection_cap(tmp_path: Path):
    """At ``ulimit -n 256`` (a cap of 187), 60 clients that do not read their 8 MiB answers
    hold 60 connections and 60 answer files (memfds in the front): of 150 more connections,
    about 67 are served and the rest refused. Not counting the files, 118 were served (32
    refused), the front's descriptors all but gone: the next body's buffer or a probe found
    none."""

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    port, health = free_ports(2)
    ports = ("--port", str(port), "--healthcheck-port", str(health))
    runtime = RuntimeProcess(
        runtime_command("--host", "127.0.0.1", *ports, "--handler", "main:big"),
        cwd=HANDLERS / "cn_stream",
        env=runtime_env(TMPDIR=str(tmp_path)),
        preexec_fn=low_limit,
    )
    runtime.port, runtime.healthcheck_port = port, health
    held: list[socket.socket] = []
    try:
        runtime.wait_healthy(20)
        for index in range(60):
            reader = socket.socket()
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.settimeout(20)
            reader.connect(("127.0.0.1", port))
            reader.sendall(f"GET /?mib=8&tag=s{index} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert reader.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 200 ")
            held.append(reader)
        fds = Path(f"/proc/{runtime.popen.pid}/fd")
        files = sum("abeja-body" in _target(fd) for fd in fds.iterdir())
        assert files >= 60, files  # each answer's memfd, held while its client has not read it
        statuses = []
        for _ in range(150):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
            try:
                sock.sendall(b"GET /health_check HTTP/1.1\r\nHost: x\r\n\r\n")
                statuses.append(_status_of(sock))
            except ConnectionResetError:  # refused: its 503 came, then the close beat our read
                statuses.append(b"503")
        assert statuses.count(b"503") >= 60, statuses  # 32 when the files were not counted
        assert set(statuses) == {b"200", b"503"}
        livez = http.client.HTTPConnection("127.0.0.1", health, timeout=10)
        livez.request("GET", "/livez")
        assert livez.getresponse().status == 200
        livez.close()
    finally:
        for sock in held:
            sock.close()
        runtime.popen.terminate()
        runtime.popen.wait(20)


def _target(fd: Path) -> str:
    """Where a descriptor of /proc/PID/fd points ("" for one closed since it was listed)."""
    try:
        return os.readlink(fd)
    except FileNotFoundError:
        return ""


def _status_of(sock: socket.socket) -> bytes:
    """The status code of the answer on ``sock`` (its first 12 bytes, however they come)."""
    head = b""
    while len(head) < 12:
        piece = sock.recv(12 - len(head))
        assert piece, head
        head += piece
    return head[9:12]


def trickle(tricklers: list[socket.socket], head: str, piece: bytes, rounds: int) -> list[bytes]:
    """Each of ``tricklers`` sends ``head``, then ``piece`` each half second (the clients'
    pace, what is tested: not a wait for the server) until its answer comes, for ``rounds``
    rounds at most: the answers (empty where none came)."""
    for sock in tricklers:
        sock.sendall(head.encode())
    answers: list[bytes] = [b""] * len(tricklers)
    for _ in range(rounds):
        for index, sock in enumerate(tricklers):
            if answers[index]:
                continue
            if select.select([sock], [], [], 0)[0]:
                answers[index] = read_until_closed(sock)
            else:
                sock.sendall(piece)
        if all(answers):
            break
        time.sleep(0.5)
    return answers


def _served(connection: http.client.HTTPConnection) -> bool:
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        connection.close()
        return False
    return response.status == 200


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_trickling_bodies_give_their_places_to_an_upload_that_keeps_up(
    make_server: ServerFactory, framing: str
):
    """Five clients trickling a byte every half second held all five places for bodies, and
    every other upload above 64 KiB waited out its whole deadline (issue 29 point 4): a body
    that holds a place must average 1 KiB/s once --request-head-timeout has passed."""
    server = make_server("rq_echo", "--request-head-timeout", "2", "--timeout", "120")
    size = 200 * 1024
    if framing == "chunked":
        head = "POST /?m=read_chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    else:
        head = f"POST /?m=read_chunks HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
    tricklers = [connect(server) for _ in range(5)]
    try:
        # The client's pace, a byte each half second, 10 s at most.
        answers = trickle(tricklers, head, b"1\r\nx\r\n" if framing == "chunked" else b"x", 20)
        # A body of known length is judged by its deadline first: at 2 bytes/s, 200 KiB
        # could not arrive in 120 s; a chunked one, by the floor.
        said = b"slower than the 1024 bytes/s" if framing == "chunked" else b"cannot be received"
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert said in answer
        body = os.urandom(size)
        kept_up = server.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
        assert kept_up.status == 200
        assert base64.b64decode(kept_up.json()["contents"][0]["body"]) == body
    finally:
        for sock in tricklers:
            sock.close()


@pytest.mark.parametrize("size_mib", [1, 4], ids=["direct", "aiohttp"])
def test_bodies_that_cannot_arrive_before_their_deadline_give_their_places_up_early(
    make_server: ServerFactory, size_mib: int
):
    """Five uploads arriving at 1,200 bytes/s, above the 1 KiB/s floor but far too slowly to
    be whole within the 120 s deadline, held all five places for the whole deadline while a
    100 KiB upload waited (issue 37 point 5): a body of known length that could not arrive in
    time even at twice its rate is cut once its rate is known, and the upload is served."""
    server = make_server("rq_echo", "--timeout", "120")
    head = f"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {size_mib * 1024 * 1024}\r\n\r\n"
    tricklers = [connect(server) for _ in range(5)]
    try:
        # The client's pace, 600 bytes each half second, 20 s at most.
        answers = trickle(tricklers, head, b"x" * 600, 40)
        for answer in answers:
            assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
            assert b"cannot be received before the request's deadline" in answer
        body = os.urandom(100 * 1024)
        waited = server.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
        assert waited.status == 200
    finally:
        for sock in tricklers:
            sock.close()


def test_a_burst_of_connections_is_held_for_the_front_not_dropped(make_server: ServerFactory):
    """The kernel holds as many connections for the port as gunicorn's and uvicorn's backlog
    (2048) while the front cannot accept them (here: stopped): a burst of 400 clients all
    connect. With aiohttp's 128 (the listen of its server) the rest were dropped, each to
    retry a second later (a thousand streams begun at once: the last started over a second
    late). Then each is served."""
    server = make_server("ld_sync")
    os.kill(server.process.pid, signal.SIGSTOP)
    clients: list[socket.socket] = []
    try:
        for _ in range(400):
            sock = socket.socket()
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.connect(("127.0.0.1", server.port))
            clients.append(sock)
        waiting = {sock.fileno(): sock for sock in clients}
        poll = select.poll()
        for fd in waiting:
            poll.register(fd, select.POLLOUT)
        for _ in range(200):  # bounded: connected at once, or (dropped) not before a retry
            for fd, _ in poll.poll(50):
                poll.unregister(fd)
                waiting.pop(fd)
            if not waiting:
                break
        assert not waiting, f"{len(waiting)} of 400 connections were not taken while it waited"
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    answers = []
    for sock in clients:  # one at a time: none waits in the queue
        sock.setblocking(True)
        sock.settimeout(30)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answers.append(read_until_closed(sock))
        sock.close()
    assert all(answer.startswith(b"HTTP/1.1 200 ") for answer in answers)
