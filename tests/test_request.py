"""What the handler receives (issue point 5; contract A2 and Part B 2.3), over real HTTP."""

from __future__ import annotations

import base64
import json
import socket

import pytest
from helpers.waiting import wait_until


@pytest.fixture
def echo(make_server):
    return make_server("rq_echo")


def _multipart(boundary: str, parts: list[tuple[str, str | None, str | None, bytes]]) -> bytes:
    lines = b""
    for name, file_name, content_type, body in parts:
        disposition = f'form-data; name="{name}"'
        if file_name is not None:
            disposition += f'; filename="{file_name}"'
        lines += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if content_type:
            lines += f"Content-Type: {content_type}\r\n".encode()
        lines += b"\r\n" + body + b"\r\n"
    return lines + f"--{boundary}--\r\n".encode()


def test_post_json_has_exactly_the_five_keys_and_the_body(echo):
    answer = echo.post_json({"foo": "bar"}, headers={"Accept-Encoding": "gzip, br"})
    seen = answer.json()
    assert answer.status == 200
    assert seen["keys"] == ["http_method", "content_type", "headers", "http_headers", "contents"]
    assert seen["len"] == 5
    assert seen["metadata_in"] is False and seen["http_method_in"] is True
    assert seen["http_method"] == "POST"
    assert seen["content_type"] == "application/json"
    assert seen["accept_encoding"] == "gzip, br"
    assert seen["missing_header"] is None
    (content,) = seen["contents"]
    assert base64.b64decode(content["body"]) == b'{"foo": "bar"}'
    assert content["content_type"] is None and content["form_name"] is None


def test_headers_list_is_sorted_lower_case_and_keeps_repeated_values(echo):
    seen = echo.request(
        "POST", "/", b"x", {"Content-Type": "text/plain", "X-B": "2", "x-a": "1"}
    ).json()
    keys = [entry["key"] for entry in seen["headers"]]
    assert keys == sorted(keys) and all(key == key.lower() for key in keys)
    assert {"key": "x-a", "values": ["1"]} in seen["headers"]
    assert ["x-b", "2"] in seen["http_headers"]


def test_authorization_headers_never_reach_the_handler(echo):
    seen = echo.request(
        "POST",
        "/",
        b"x",
        {"Authorization": "Bearer secret", "Proxy-Authorization": "Basic x", "Cookie": "a=1"},
    ).json()
    keys = {entry["key"] for entry in seen["headers"]}
    assert "authorization" not in keys and "proxy-authorization" not in keys
    assert "cookie" in keys
    assert "secret" not in json.dumps(seen)


def test_json_load_of_the_request_works(make_server):
    server = make_server("rq_echo", "--handler", "main:read_json")
    assert server.post_json({"total_without_tax": 100}).json() == {"total_without_tax": 100}


def test_get_delivers_the_raw_query_as_body_and_decoded_query_as_attribute(echo):
    seen = echo.request("GET", "/some/path?a=1&b=%E3%81%82&a=2").json()
    assert seen["http_method"] == "GET"
    assert seen["content_type"] == "application/x-www-form-urlencoded"
    assert base64.b64decode(seen["contents"][0]["body"]) == b"a=1&b=%E3%81%82&a=2"
    assert seen["path"] == "/some/path"
    assert seen["query"] == {"a": ["1", "2"], "b": ["あ"]}
    assert seen["query_string"] == "a=1&b=%E3%81%82&a=2"


def test_get_without_query_has_an_empty_body(echo):
    seen = echo.request("GET", "/").json()
    assert base64.b64decode(seen["contents"][0]["body"]) == b""


@pytest.mark.parametrize("method", ["PUT", "PATCH", "DELETE"])
def test_other_methods_are_delivered_like_post(echo, method):
    seen = echo.request(method, "/x?y=1", b"payload", {"Content-Type": "text/plain"}).json()
    assert seen["http_method"] == method
    assert base64.b64decode(seen["contents"][0]["body"]) == b"payload"
    assert seen["path"] == "/x" and seen["query"] == {"y": ["1"]}


@pytest.mark.parametrize(
    ("sent", "seen"),
    [
        ("..", None),
        (".", None),
        ("../", None),
        ("a/..", None),
        ("", None),
        ("x/.hidden", ".hidden"),
        ("a\x00.py", None),  # a NUL would cut the name short in C code
        ("a\x1b[2J.txt", None),
        ("a\x7f", None),
    ],
)
def test_part_file_names_never_carry_path_meaning(echo, sent, seen):
    body = _multipart("B", [("f", sent, "text/plain", b"x")])
    answer = echo.request("POST", "/", body, {"Content-Type": "multipart/form-data; boundary=B"})
    assert answer.json()["contents"][0]["file_name"] == seen


def test_post_without_content_type_is_octet_stream(echo):
    seen = echo.request("POST", "/", b"\x00\x01").json()
    assert seen["content_type"] == "application/octet-stream"


def test_multipart_parts_keep_order_names_types_and_base_file_names(echo):
    body = _multipart(
        "XyZ",
        [
            ("file1", None, "application/json", b'{"foo": "bar"}'),
            ("image", "../../etc/cat.jpg", "image/jpeg", b"\xff\xd8jpeg"),
            ("field", None, None, b"value"),
            ("empty", None, None, b""),
            ("win", "C:\\Users\\me\\dog.png", "image/png", b"png"),
        ],
    )
    seen = echo.request("POST", "/", body, {"Content-Type": "multipart/form-data; boundary=XyZ"})
    seen = seen.json()
    assert seen["content_type"] == "multipart/form-data; boundary=XyZ"
    parts = seen["contents"]
    assert [p["form_name"] for p in parts] == ["file1", "image", "field", "empty", "win"]
    assert [p["file_name"] for p in parts] == [None, "cat.jpg", None, None, "dog.png"]
    assert [p["content_type"] for p in parts] == [
        "application/json",
        "image/jpeg",
        None,
        None,
        "image/png",
    ]
    assert [base64.b64decode(p["body"]) for p in parts] == [
        b'{"foo": "bar"}',
        b"\xff\xd8jpeg",
        b"value",
        b"",
        b"png",
    ]


def test_multipart_with_no_parts_gives_empty_contents(echo):
    seen = echo.request(
        "POST", "/", b"--b--\r\n", {"Content-Type": "multipart/form-data; boundary=b"}
    ).json()
    assert seen["contents"] == []


def test_large_body_is_spooled_and_read_back_byte_exact(make_server):
    server = make_server("rq_echo", "--spool-threshold", "1024")
    payload = bytes(range(256)) * 64  # 16 KiB
    seen = server.request("POST", "/", payload, {"Content-Type": "application/octet-stream"})
    (content,) = seen.json()["contents"]
    assert base64.b64decode(content["body"]) == payload
    assert content["spooled_to_disk"] is True


def test_many_bodies_in_shared_memory_at_once_all_arrive(make_server):
    """Bodies above 64 KiB travel to the worker as descriptors. 40 of them wait while a slow
    call runs, then go to the worker at once: more of them in one write than one read there
    once took (a worker lost the descriptors beyond 8 and died, again and again)."""
    server = make_server("ex_sleep")
    slow = socket.create_connection(("127.0.0.1", server.port), 10)
    slow.sendall(b"GET /?sleep=0.5 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until(lambda: _events(server, "start"), 5, "the slow call to start")
    body = b"x" * (100 * 1024)
    head = f"POST /?tag=big HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    waiting = [socket.create_connection(("127.0.0.1", server.port), 10) for _ in range(40)]
    for connection in waiting:
        connection.sendall(head.encode() + body)
    for connection in [slow, *waiting]:
        with connection:
            assert connection.recv(12) == b"HTTP/1.1 200"
    # Each call logged its end before it answered; the log may reach us after the answer.
    wait_until(lambda: _events(server, "end") == 41, 10, "41 calls to have ended")


def _events(server, event: str) -> int:
    return sum(
        record.get("message", "").count(f'"event": "{event}"') for record in server.records()
    )


def test_large_multipart_part_is_spooled(make_server):
    server = make_server("rq_echo", "--spool-threshold", "1KiB")
    big = b"z" * 5000
    body = _multipart("b", [("small", None, None, b"s"), ("big", "big.bin", None, big)])
    seen = server.request("POST", "/", body, {"Content-Type": "multipart/form-data; boundary=b"})
    small, large = seen.json()["contents"]
    assert small["spooled_to_disk"] is False and large["spooled_to_disk"] is True
    assert base64.b64decode(large["body"]) == big


def test_chunked_body_is_read_in_chunks_by_the_handler(make_server):
    server = make_server("rq_echo", "--handler", "main:read_chunks")

    def chunks():
        for _ in range(40):
            yield b"x" * 100_000

    answer = server.request(
        "POST",
        "/",
        chunks(),
        {"Content-Type": "application/octet-stream"},  # type: ignore[arg-type]
    )
    assert answer.json() == {"size": 4_000_000}


def test_handler_may_return_the_request_body_itself(make_server):
    server = make_server("rq_echo", "--handler", "main:lazy_body")
    payload = b"echo me" * 1000
    answer = server.request("POST", "/", payload, {"Content-Type": "application/octet-stream"})
    assert answer.status == 200 and answer.body == payload


def test_a_multipart_body_with_too_many_parts_is_refused(make_server):
    server = make_server("rq_echo", "--max-parts", "3")
    many = _multipart("B", [(f"f{n}", None, None, b"x") for n in range(4)])
    answer = server.request("POST", "/", many, {"Content-Type": "multipart/form-data; boundary=B"})
    assert answer.status == 413
    assert answer.json() == {
        "status": "multipart/form-data body has more than 3 parts; the limit is "
        "ABEJA_RUNTIME_MAX_PARTS (--max-parts)"
    }
    three = _multipart("B", [(f"f{n}", None, None, b"x") for n in range(3)])
    fine = server.request("POST", "/", three, {"Content-Type": "multipart/form-data; boundary=B"})
    assert fine.status == 200 and len(fine.json()["contents"]) == 3


def test_by_default_a_thousand_parts_pass_and_more_do_not(echo):
    form = {"Content-Type": "multipart/form-data; boundary=B"}
    for count, status in ((1000, 200), (1001, 413)):
        body = _multipart("B", [(f"f{n}", None, None, b"") for n in range(count)])
        assert echo.request("POST", "/", body, form).status == status, count
