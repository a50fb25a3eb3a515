"""Connection limits over raw sockets: a refused body is not read, slow heads and idle
connections are cut off, and health stays fast meanwhile (issue 8, points 6 and 7)."""

from __future__ import annotations

import contextlib
import select
import socket
import time

import pytest
from conftest import RunningServer, ServerFactory, wait_until

MiB = 1024 * 1024


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


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
    block = b"x" * MiB
    if framing == "chunked":
        block = f"{len(block):x}\r\n".encode() + block + b"\r\n"
    sent = 0
    deadline = time.monotonic() + 30
    answered = False
    sock.setblocking(False)
    while sent < size and time.monotonic() < deadline:
        readable, writable, _ = select.select([sock], [sock], [], 1.0)
        if readable:  # like curl: an early answer stops the upload
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
    answer = read_until_closed(sock)
    sock.close()

    assert answered, f"no answer while sending; sent {sent / MiB:.0f} MiB"
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"request body too large' in answer
    assert sent < 64 * MiB, f"the server took in {sent / MiB:.0f} MiB after refusing the body"
    assert server.request("GET", "/").status == 200  # and it stays up


def test_a_slow_request_head_gets_408_and_health_stays_fast(make_server: ServerFactory):
    server = make_server("ld_sync", "--request-head-timeout", "2")
    tricklers = []
    for _ in range(200):
        sock = connect(server)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        tricklers.append(sock)
    silent = connect(server)  # a connection that never sends anything
    began = time.monotonic()
    for round_ in range(3):  # keep trickling: one header byte per socket per round
        for sock in tricklers:
            with contextlib.suppress(OSError):  # cut off already: the deadline is from byte 1
                sock.sendall(b"X")
        before = time.monotonic()
        assert server.health() == 200
        assert server.request("GET", "/").status == 200
        assert time.monotonic() - before < 1.0, f"round {round_}: health and a request were slow"

    answers = [read_until_closed(sock) for sock in tricklers]
    elapsed = time.monotonic() - began
    for sock in tricklers:
        sock.close()
    assert all(a.startswith(b"HTTP/1.1 408 Request Timeout") for a in answers), answers[0][:200]
    assert b'"request head not received in time"' in answers[0]
    assert read_until_closed(silent) == b""  # closed without an answer: it asked nothing
    silent.close()
    assert elapsed < 10, f"cut off after {elapsed:.1f} s with a 2 s head timeout"


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout(make_server: ServerFactory):
    server = make_server("ld_sync", "--keepalive-timeout", "1")
    sock = connect(server)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    first = sock.recv(65536)
    assert first.startswith(b"HTTP/1.1 200 ")
    began = time.monotonic()
    assert read_until_closed(sock) == b""  # the server closes it; nothing more is sent
    idle = time.monotonic() - began
    sock.close()
    assert 0.5 < idle < 8, f"closed after {idle:.1f} s idle with a 1 s keep-alive timeout"


def test_connection_timeouts_are_validated(make_server: ServerFactory):
    server = make_server("ld_sync", "--keepalive-timeout", "0", wait=False)
    assert server.wait_exit() == 2
    wait_until(lambda: any("keepalive-timeout" in line for line in server.lines), 5, "the error")
