"""Request heads the runtime refuses, over raw sockets (issue 37, points 6 and 8).

* A malformed head (a garbage request line, a header line without a colon) is answered ``400``
  JSON, said in one warning line without a traceback (it was an ``error`` record of 640 bytes
  with aiohttp's traceback, or nothing at all for a garbage request line), and counted in
  ``abeja_runtime_rejected_heads_total``.
* A head longer than ``--max-head-size`` (64 KiB) is answered ``431`` JSON and its connection
  closed, counted too; one of exactly 64 KiB is served. The front holds no more of a head than
  that: 100 clients sending 1 MB heads took it from 40 to 239 MiB, kept after they left.

Each is tried on both ways in: a request the direct path serves (a ``Content-Length`` body)
and one aiohttp's own path serves (a chunked body), on a fresh connection and on one that
served a request of its way first.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import select
import socket
from typing import Any

import pytest
from helpers.raw_http import records_of, unread_by
from helpers.servers import RunningServer, ServerFactory, front_memory_mib
from helpers.waiting import wait_until

LIMIT = 64 * 1024
WAYS = ["direct", "aiohttp"]
BODY = b"b" * 200_000


@pytest.fixture(scope="module")
def echo(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("rq_echo")


def first_lines(way: str) -> bytes:
    """A POST's request line and headers (each line with its CRLF) for ``way``'s framing of
    :data:`BODY`."""
    if way == "direct":
        framing = b"Content-Length: %d" % len(BODY)
    else:
        framing = b"Transfer-Encoding: chunked"
    return b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" + framing + b"\r\n"


def framed_body(way: str) -> bytes:
    return BODY if way == "direct" else b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


def head_of(size: int, way: str) -> bytes:
    """A head of exactly ``size`` bytes for ``way``: its first lines, padding header lines of
    at most 8000 bytes each (below aiohttp's limit of a line) and the empty line."""
    start = first_lines(way)
    left = size - len(start) - 2
    count = -(-left // 8000)
    lines = [start]
    for index in range(count):
        line_size = left // count + (1 if index < left % count else 0)
        name = b"X-Pad-%d: " % index
        lines.append(name + b"p" * (line_size - len(name) - 2) + b"\r\n")
    head = b"".join(lines) + b"\r\n"
    assert len(head) == size
    return head


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def serve_one(sock: socket.socket, way: str) -> None:
    """A request served on ``sock`` by ``way``, before the one under test."""
    request = first_lines(way) + b"\r\n" + framed_body(way)
    sock.sendall(request)
    status, _, _ = read_answer(sock)
    assert status == 200


def read_answer(sock: socket.socket) -> tuple[int, http.client.HTTPMessage, bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.headers, response.read()


def send_in_two_reads(server: RunningServer, sock: socket.socket, data: bytes, cut: int) -> None:
    """``data`` in two pieces, the second once the server has read the first."""
    sock.sendall(data[:cut])
    wait_until(lambda: unread_by(server) == 0, 10, "the server to read the first piece")
    sock.sendall(data[cut:])


def rejected_heads(server: RunningServer, reason: str) -> float:
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    prefix = f'abeja_runtime_rejected_heads_total{{reason="{reason}"}} '
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    raise AssertionError(f"no {prefix.strip()} in /metrics")


def said_since(server: RunningServer, since: int, marker: str) -> list[dict[str, Any]]:
    """The records of level warning or above logged after the first ``since`` records, up to
    the access record of a request made now (``marker``): all that the front logged before."""
    server.request("GET", "/", headers={"x-abeja-request-id": marker})
    wait_until(lambda: records_of(server, marker), 10, "the marker's access record")
    records = server.records()[since:]
    end = next(i for i, r in enumerate(records) if r.get("request_id") == marker)
    return [r for r in records[:end] if r.get("log_level") in ("warning", "error", "critical")]


MALFORMED = {
    "a garbage request line": b"GARBAGE\r\n\r\n",
    "a header line without a colon": b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
}


@pytest.mark.parametrize("head", MALFORMED.values(), ids=MALFORMED.keys())
@pytest.mark.parametrize("before", ["fresh", "after a request"])
@pytest.mark.parametrize("way", WAYS)
def test_a_malformed_head_is_a_400_said_in_one_warning_line_and_counted(
    echo: RunningServer, way: str, before: str, head: bytes
):
    counted = rejected_heads(echo, "malformed")
    since = len(echo.records())
    with connect(echo) as sock:
        if before != "fresh":
            serve_one(sock, way)
        sock.sendall(head)
        status, _, body = read_answer(sock)
        assert sock.recv(1) == b""  # and the connection closed
    assert status == 400
    assert json.loads(body)["status"].startswith("malformed HTTP request: ")
    (said,) = said_since(echo, since, f"malformed-{way}-{len(head)}-{before.replace(' ', '-')}")
    assert said["log_level"] == "warning"
    assert said["message"].startswith("malformed HTTP request from 127.0.0.1; answered 400: ")
    assert "traceback" not in said and len(json.dumps(said)) < 300
    assert rejected_heads(echo, "malformed") == counted + 1


@pytest.mark.parametrize("arrival", ["whole", "its end in the next read"])
@pytest.mark.parametrize("way", WAYS)
def test_a_head_of_exactly_the_limit_is_served_with_its_body(
    echo: RunningServer, way: str, arrival: str
):
    """The limit counts the head's bytes, its empty line included; the body that arrives with
    it (in the same read, or the next) is the request's, byte for byte."""
    head = head_of(LIMIT, way)
    request = head + framed_body(way)
    with connect(echo) as sock:
        if arrival == "whole":
            sock.sendall(request)
        else:
            send_in_two_reads(echo, sock, request, LIMIT - 2)
        status, _, body = read_answer(sock)
    assert status == 200, body[:300]
    seen = json.loads(body)
    sent = [line.decode().lower().split(": ") for line in head.split(b"\r\n")[1:-2]]
    assert [pair for pair in seen["http_headers"] if pair[0].startswith("x-pad-")] == [
        pair for pair in sent if pair[0].startswith("x-pad-")
    ]
    (content,) = seen["contents"]
    assert base64.b64decode(content["body"]) == BODY


@pytest.mark.parametrize("arrival", ["whole", "in two reads"])
@pytest.mark.parametrize("before", ["fresh", "after a request"])
@pytest.mark.parametrize("way", WAYS)
def test_a_head_past_the_limit_is_a_431_that_ends_its_connection(
    echo: RunningServer, way: str, before: str, arrival: str
):
    """One byte more than the limit: the head is refused, said in one warning line and
    counted; what the client still sends is dropped, and it reads its answer."""
    counted = rejected_heads(echo, "too_large")
    since = len(echo.records())
    request = head_of(LIMIT + 1, way) + framed_body(way)
    with connect(echo) as sock:
        if before != "fresh":
            serve_one(sock, way)
        if arrival == "whole":
            sock.sendall(request)
        else:
            send_in_two_reads(echo, sock, request, LIMIT // 2)
        status, headers, body = read_answer(sock)
        assert sock.recv(1) == b""  # the connection ends
    assert status == 431, body[:300]
    assert headers["Connection"] == "close" and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {
        "status": "request head larger than 65536 bytes (its request line and headers); send "
        "fewer or shorter headers, or raise the limit, ABEJA_RUNTIME_MAX_HEAD_SIZE "
        "(--max-head-size)"
    }
    (said,) = said_since(echo, since, f"too-large-{way}-{arrival.replace(' ', '-')}-{before[0]}")
    assert said["log_level"] == "warning" and "answered 431" in said["message"]
    assert rejected_heads(echo, "too_large") == counted + 1


def test_many_partial_heads_do_not_fill_the_front(make_server: ServerFactory):
    """100 clients hold heads just short of the limit, 100 more send 1 MB heads (125 lines of
    8.1 KB, within aiohttp's own limits) and wait: once the front has read all they sent, it
    holds no more than the limit of each (measured: it grew by 210 MiB before, by 26 MiB now).
    The long heads are answered 431, the short ones wait for their end."""
    server = make_server("rq_echo")
    at_rest = front_memory_mib(server)
    line = b"X-Pad: " + b"p" * 8091 + b"\r\n"
    long_head = b"GET / HTTP/1.1\r\nHost: x\r\n" + line * 125
    short_head = long_head[: LIMIT - 1024]
    with contextlib.ExitStack() as stack:
        short = [stack.enter_context(connect(server)) for _ in range(100)]
        long = [stack.enter_context(connect(server)) for _ in range(100)]
        for sock in short:
            sock.sendall(short_head)
        for sock in long:
            sock.sendall(long_head)
        wait_until(lambda: unread_by(server) == 0, 30, "the front to read all that was sent")
        grown = front_memory_mib(server) - at_rest
        assert grown < 64, f"the front grew by {grown:.0f} MiB"
        for sock in long:
            status, _, _ = read_answer(sock)
            assert status == 431
        assert select.select(short, [], [], 0)[0] == []  # no answer: their heads go on
