"""Bad input and broken handlers get clear JSON errors and lose nothing (issue point 7)."""

from __future__ import annotations

import http.client
import os
import socket

import pytest

MULTIPART = "multipart/form-data; boundary=b"
GOOD_MULTIPART = (
    b'--b\r\nContent-Disposition: form-data; name="f"; filename="a.bin"\r\n\r\n'
    + b"x" * 3000
    + b"\r\n--b--\r\n"
)


@pytest.fixture(scope="module")
def server(make_module_server):
    return make_module_server("er_mixed", "--max-body-size", "1MiB", "--spool-threshold", "1KiB")


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (GOOD_MULTIPART, "multipart/form-data", "no boundary parameter"),
        (b"garbage without boundary", MULTIPART, "malformed multipart/form-data body"),
        (GOOD_MULTIPART[:60], MULTIPART, "malformed multipart/form-data body"),
        (b"--b\r\nno colon header line\r\n\r\nx\r\n--b--\r\n", MULTIPART, "malformed multipart"),
        (b"", MULTIPART, "malformed multipart/form-data body"),
    ],
    ids=["no-boundary", "not-multipart", "truncated", "bad-part-header", "empty"],
)
def test_malformed_multipart_is_400_json(server, body, content_type, fragment):
    answer = server.request("POST", "/", body, {"Content-Type": content_type})
    assert answer.status == 400
    assert answer.headers["Content-Type"] == "application/json"
    assert fragment in answer.json()["status"]
    assert server.request("POST", "/", GOOD_MULTIPART, {"Content-Type": MULTIPART}).status == 200


def test_malformed_percent_encoding_is_400(server):
    answer = server.request("GET", "/?q=%ff%fe")
    assert answer.status == 400
    assert answer.json() == {"status": "the query string is not valid percent-encoded UTF-8"}


@pytest.mark.parametrize(
    ("mode", "log_fragment"),
    [
        ("raise", "unexpected error occurred in the handler"),
        ("bad_status", "status_code 1000"),
        ("status&code=100", "status_code 100;"),
        ("status&code=101", "status_code 101;"),
        ("status&code=199", "status_code 199;"),
        ("not_dict", "the handler returned a str"),
    ],
)
def test_handler_mistakes_are_500_with_a_log_line_naming_them(server, mode, log_fragment):
    request_id = f"id-{mode}".replace("&", "-")
    answer = server.request("GET", f"/?mode={mode}", headers={"x-abeja-request-id": request_id})
    assert answer.status == 500
    assert answer.json() == {"status": "unexpected error occurred"}
    record = server.wait_for_record(
        lambda r: r.get("request_id") == request_id and r.get("log_level") == "error"
    )
    assert log_fragment in record["message"]
    assert "main:handler" in record["message"]  # the handler it is about
    assert server.request("GET", "/").status == 200


def test_stream_failing_midway_cuts_the_response_and_the_server_stays_up(server):
    with pytest.raises(http.client.IncompleteRead):
        server.request("GET", "/?mode=stream_fails")
    assert server.request("GET", "/").status == 200


def test_body_over_the_limit_is_413(server):
    answer = server.request(
        "POST", "/", b"x" * (1024 * 1024 + 1), {"Content-Type": "application/octet-stream"}
    )
    assert answer.status == 413
    assert answer.json() == {"status": "request body too large (limit 1048576 bytes)"}


def test_chunked_body_over_the_limit_is_413(server):
    def chunks():
        for _ in range(20):
            yield b"x" * 100_000

    answer = server.request("POST", "/", chunks(), {"Content-Type": "text/plain"})  # type: ignore[arg-type]
    assert answer.status == 413


def test_huge_declared_length_is_refused_before_the_body_is_sent(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: 10000000000\r\n\r\n"
        )
        head = sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 413")
    assert server.request("GET", "/").status == 200


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "TRACE"])
def test_other_methods_are_405_with_allow(server, method):
    answer = server.request(method, "/")
    assert answer.status == 405
    assert answer.headers["Allow"] == "GET, POST, PUT, PATCH, DELETE"
    if method != "HEAD":
        assert answer.json()["status"].startswith(f"method {method} is not allowed")


def test_header_flood_is_400_json(server):
    headers = {f"x-h{i}": "v" for i in range(200)}
    answer = server.request("GET", "/", headers=headers)
    assert answer.status == 400
    assert "malformed HTTP request" in answer.json()["status"]
    assert server.request("GET", "/").status == 200


def test_no_temp_file_is_left_after_100_mixed_requests(make_server, tmp_path):
    server = make_server("er_mixed", "--max-body-size", "64KiB", "--spool-threshold", "1KiB")
    big = b"y" * 5000
    requests = [
        ("POST", "/", big, {"Content-Type": "application/octet-stream"}),  # spooled, ok
        ("POST", "/", GOOD_MULTIPART, {"Content-Type": MULTIPART}),  # spooled part, ok
        ("POST", "/?mode=raise", big, {"Content-Type": "text/plain"}),  # spooled, 500
        ("POST", "/", GOOD_MULTIPART[:-8], {"Content-Type": MULTIPART}),  # spooled, 400
        ("POST", "/", b"z" * 70_000, {"Content-Type": "text/plain"}),  # spooled, 413
    ]
    statuses, spooled = set(), set()
    for i in range(100):
        method, path, body, headers = requests[i % len(requests)]
        answer = server.request(method, path, body, headers)
        statuses.add(answer.status)
        if answer.status == 200:
            spooled.add(answer.json()["spooled"])
    assert statuses == {200, 400, 413, 500}
    assert spooled == {True}, "the bodies must really have gone to disk for this test to mean much"
    assert server.health() == 200
    # Request directories are removed before the response is written, so none may remain now
    # in the front's folder (which lives as long as the runtime, with its metrics and lock).
    (folder,) = os.listdir(tmp_path)
    assert folder.startswith("abeja-runtime-")
    assert sorted(os.listdir(tmp_path / folder)) == ["lock", "metrics"]
