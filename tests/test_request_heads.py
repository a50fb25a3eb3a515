"""Request heads that a client may really send, over raw sockets on every body path: a header
name sent twice (two ``Accept``, ``Cookie`` or ``X-Forwarded-For`` lines, as haproxy's ``option
forwardfor`` adds one) and request ids the runtime cannot echo (a byte outside ASCII, a tab, a
thousand characters). Each gets its answer, one access record, and leaves nothing
in flight (issue 28, points 1 and 2).

The three body paths: a small body with a ``Content-Length`` (the direct path, in the frame),
a big one (the direct path, captured into shared memory) and a chunked one (aiohttp's path).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from typing import Any

import pytest
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

BODY_PATHS = ["small", "big", "chunked"]
_FRESH_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def echo(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("rq_echo")


def raw_request(server: RunningServer, head_lines: list[bytes], body_path: str) -> bytes:
    """A POST of a JSON body whose head holds ``head_lines`` as written, sent by
    ``body_path``."""
    body = json.dumps({"pad": "x" * (200_000 if body_path == "big" else 10)}).encode()
    head = [b"POST / HTTP/1.1", b"Host: test", b"Content-Type: application/json", *head_lines]
    if body_path == "chunked":
        head.append(b"Transfer-Encoding: chunked")
        framed = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        head.append(b"Content-Length: %d" % len(body))
        framed = body
    return b"\r\n".join(head) + b"\r\n\r\n" + framed


def exchange(server: RunningServer, request: bytes, *, times: int = 1) -> list[Any]:
    """Send ``request`` ``times`` over one keep-alive connection; each answer as
    (status, headers, body). A connection left without an answer fails at the socket's
    timeout rather than hanging the test."""
    answers = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        for _ in range(times):
            sock.sendall(request)
            response = http.client.HTTPResponse(sock)
            response.begin()
            answers.append((response.status, response.headers, response.read()))
    return answers


def access_records(server: RunningServer, request_id: str) -> list[dict[str, Any]]:
    return [
        record
        for record in server.records()
        if record.get("log_type") == "access_log" and record.get("request_id") == request_id
    ]


@pytest.mark.parametrize("body_path", BODY_PATHS)
@pytest.mark.parametrize("name", ["Accept", "Cookie", "X-Forwarded-For"])
def test_a_header_name_sent_twice_is_answered_with_both_values(
    echo: RunningServer, body_path: str, name: str
):
    lines = [f"{name}: first".encode(), f"{name}: second".encode()]
    answers = exchange(echo, raw_request(echo, lines, body_path), times=2)
    for status, _, body in answers:  # and the connection serves the next request
        assert status == 200, body
        seen = json.loads(body)
        assert [name.lower(), "first"] in seen["http_headers"]
        assert [name.lower(), "second"] in seen["http_headers"]
        assert {"key": name.lower(), "values": ["first", "second"]} in seen["headers"]


UNECHOABLE_IDS = {
    "a byte outside ASCII": b"abc\xffdef",
    "UTF-8 text": "réquest-ïd".encode(),
    "a tab (the one control character the parser lets through)": b"abc\tdef",
    "a thousand characters": b"a" * 1000,
}


@pytest.mark.parametrize("body_path", BODY_PATHS)
@pytest.mark.parametrize("given", UNECHOABLE_IDS.values(), ids=UNECHOABLE_IDS.keys())
def test_a_request_id_that_cannot_be_echoed_is_replaced_by_a_fresh_one(
    echo: RunningServer, body_path: str, given: bytes
):
    lines = [b"x-abeja-request-id: " + given, b"x-abeja-requester-id: " + given]
    answers = exchange(echo, raw_request(echo, lines, body_path), times=2)
    ids = []
    for status, headers, body in answers:
        assert status == 200, body
        fresh = headers["x-abeja-request-id"]
        assert _FRESH_ID.fullmatch(fresh), fresh
        assert json.loads(body)["request_id"] == fresh  # the handler sees the same id
        ids.append(fresh)
        (record,) = wait_until(lambda f=fresh: access_records(echo, f), 10, "its access record")
        assert record["http_status"] == 200
        assert "requester_id" not in record or record["requester_id"] is None
    assert ids[0] != ids[1]
    wait_until(lambda: echo.in_flight() == 0, 10, "no request left in flight")


@pytest.mark.parametrize("body_path", BODY_PATHS)
def test_a_printable_ascii_request_id_is_echoed_as_given(echo: RunningServer, body_path: str):
    given = "Req-42 (retry #2) ~!@$%^&*=+[]{}|;:',.<>/?" + "z" * 80
    assert len(given) <= 128
    lines = [f"x-abeja-request-id: {given}".encode()]
    ((status, headers, body),) = exchange(echo, raw_request(echo, lines, body_path))
    assert status == 200, body
    assert headers["x-abeja-request-id"] == given
    assert json.loads(body)["request_id"] == given
