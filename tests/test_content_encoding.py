"""Request bodies sent with a ``Content-Encoding``, over real HTTP: good ones reach the handler
decoded, however they are framed; a bad one (invalid data, a stream cut short, an encoding the
runtime does not undo, one that inflates past the limit) is a counted JSON error with an
access record, and the server goes on serving (issue 28 point 7)."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import re
import socket
import zlib
from typing import Any

import pytest
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

MAX_BODY = 1024 * 1024


@pytest.fixture(scope="module")
def echo(make_module_server: ServerFactory) -> RunningServer:
    return make_module_server("rq_echo", "--max-body-size", str(MAX_BODY))


def post(
    server: RunningServer, body: bytes, encoding: str, *, chunked: bool = False
) -> tuple[int, Any, str]:
    """(status, JSON body, request id) of a POST of ``body`` as sent, over a raw socket."""
    head = (
        f"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Encoding: {encoding}\r\n"
    ).encode()
    if chunked:
        framed = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 1000]), body[i : i + 1000])
            for i in range(0, len(body), 1000)
        )
        request = head + b"Transfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"
    else:
        request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(request)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return answer.status, json.loads(answer.read()), answer.headers["x-abeja-request-id"]


def received(answer: Any) -> bytes:
    return base64.b64decode(answer["contents"][0]["body"])


def deflate_raw(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


SMALL = json.dumps({"numbers": list(range(500))}).encode()
BIG = os.urandom(200 * 1024)  # does not compress: its encoded body is above 64 KiB too

GOOD = {
    "gzip": ("gzip", gzip.compress(SMALL), SMALL),
    "x-gzip": ("x-gzip", gzip.compress(SMALL), SMALL),
    "GZIP in capitals": ("GZIP", gzip.compress(SMALL), SMALL),
    "gzip of two members": (
        "gzip",
        gzip.compress(b"first ") + gzip.compress(b"second"),
        b"first second",
    ),
    "big gzip": ("gzip", gzip.compress(BIG), BIG),
    "deflate (zlib's wrapper)": ("deflate", zlib.compress(SMALL), SMALL),
    "deflate without a wrapper": ("deflate", deflate_raw(SMALL), SMALL),
    "identity": ("identity", SMALL, SMALL),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("encoding", "sent", "expected"), GOOD.values(), ids=GOOD.keys())
def test_an_encoded_body_reaches_the_handler_decoded(
    echo: RunningServer, encoding: str, sent: bytes, expected: bytes, chunked: bool
):
    status, answer, _ = post(echo, sent, encoding, chunked=chunked)
    assert status == 200, answer
    assert received(answer) == expected


_GOOD_GZIP = gzip.compress(SMALL)
_GOOD_ZLIB = zlib.compress(SMALL)
BAD = {
    "invalid gzip": ("gzip", b"this is not gzip at all", 400, "not valid gzip data"),
    "gzip cut short": ("gzip", _GOOD_GZIP[: len(_GOOD_GZIP) // 2], 400, "ends before its end"),
    "gzip with its trailer cut": ("gzip", _GOOD_GZIP[:-4], 400, "ends before its end"),
    "invalid deflate": ("deflate", b"garbage", 400, "not valid deflate data"),
    "deflate cut short": ("deflate", _GOOD_ZLIB[:-3], 400, "ends before its end"),
    "deflate with bytes after its end": ("deflate", _GOOD_ZLIB + b"tail", 400, "after the end"),
    "brotli": ("br", b"anything", 415, "Content-Encoding 'br' is not supported"),
    "compress": ("compress", b"anything", 415, "Content-Encoding 'compress' is not supported"),
    "a gzip bomb": ("gzip", gzip.compress(bytes(8 * MAX_BODY)), 413, "too large"),
}


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(("encoding", "sent", "status", "said"), BAD.values(), ids=BAD.keys())
def test_a_bad_encoded_body_is_a_counted_error_that_says_what_was_wrong(
    echo: RunningServer, encoding: str, sent: bytes, status: int, said: str, chunked: bool
):
    got, answer, request_id = post(echo, sent, encoding, chunked=chunked)
    assert got == status, answer
    assert said in answer["status"]

    def its_record() -> list[dict[str, Any]]:
        return [
            r
            for r in echo.records()
            if r.get("log_type") == "access_log" and r.get("request_id") == request_id
        ]

    (record,) = wait_until(its_record, 10, "the request's access record")
    assert record["http_status"] == status
    assert not any("Traceback" in json.dumps(r) for r in echo.records())
    status_after, answer_after, _ = post(echo, gzip.compress(SMALL), "gzip")
    assert status_after == 200 and received(answer_after) == SMALL


def test_bad_encoded_bodies_are_counted_in_the_metrics(make_server: ServerFactory):
    server = make_server("rq_echo")
    for encoding, sent, _, _ in list(BAD.values())[:5]:
        post(server, sent, encoding)
    metrics = server.request("GET", "/metrics", port=server.healthcheck_port).body.decode()
    counted = re.search(r'^abeja_runtime_requests_total\{code="400"\} (\S+)$', metrics, re.M)
    assert counted is not None and float(counted.group(1)) == 5.0, metrics
