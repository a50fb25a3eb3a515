"""Requests on one kept-alive connection, over raw sockets: the front serves a request that came
whole itself (the direct path, ``direct.py``) and hands every other one to aiohttp; whichever
serves them, the answers come in order, a long call outlives the keep-alive timer, a client
that leaves frees its request, and ``Connection: close`` is honoured."""

from __future__ import annotations

import base64
import http.client
import io
import json
import random
import socket

import pytest
from helpers.servers import RunningServer, ServerFactory
from helpers.waiting import wait_until

#: Above the inline limit (64 KiB): such a body goes through aiohttp's request handling.
BIG_BODY = b'{"pad": "' + b"x" * (100 * 1024) + b'"}'


class _Unclosable(io.BufferedReader):
    """The socket's one buffered reader, shared by the answers read from it."""

    def close(self) -> None:
        pass


class _Source:
    def __init__(self, sock: socket.socket) -> None:
        self._file = _Unclosable(socket.SocketIO(sock, "rb"))

    def makefile(self, mode: str) -> _Unclosable:
        return self._file


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` answers from ``sock``, one after the other (bounded by the socket timeout)."""
    source = _Source(sock)
    answers = []
    for _ in range(count):
        answer = http.client.HTTPResponse(source)  # type: ignore[arg-type]
        answer.begin()
        answers.append((answer.status, dict(answer.getheaders()), answer.read()))
    return answers


def request(method: str, target: str, body: bytes = b"", *extra: str) -> bytes:
    head = [f"{method} {target} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    head += [f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def chunked(target: str, body: bytes) -> bytes:
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head.encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=20)


def test_pipelined_requests_are_answered_in_order_whoever_serves_them(
    make_server: ServerFactory,
) -> None:
    server = make_server("ex_sleep")
    sock = connect(server)
    sock.sendall(
        request("POST", "/?tag=1&sleep=0.3", b"{}")  # direct, and slow: the rest queue behind
        + request("GET", "/health_check")  # the front's own path: aiohttp's handling
        + request("POST", "/?tag=3", BIG_BODY)  # above the inline limit: aiohttp's
        + chunked("/?tag=4", b"{}")  # whole, chunked: direct
        + request("GET", "/?tag=5")  # direct
    )
    answers = read_answers(sock, 5)
    sock.close()
    assert [status for status, _, _ in answers] == [200] * 5
    bodies = [json.loads(body) for _, _, body in answers]
    assert bodies[1] == {"status": "ok"}
    assert [bodies[i]["tag"] for i in (0, 2, 3, 4)] == ["1", "3", "4", "5"]
    handled = [answers[i] for i in (0, 2, 3, 4)]  # the health check has no request id
    assert len({headers["x-abeja-request-id"] for _, headers, _ in handled}) == 4


def test_bodies_read_from_the_socket_leave_the_requests_behind_them_intact(
    make_server: ServerFactory,
) -> None:
    """A body above the inline limit is read from the socket straight into a shared buffer,
    past aiohttp's parser, which starts afresh after it: the bytes of the requests sent right
    behind it (in the same write) are theirs, and each body arrives whole."""
    server = make_server("rq_echo")
    bodies = [bytes(range(256)) * 4096, b"\x07" * (200 * 1024 + 3)]  # 1 MiB, 200 KiB
    sock = connect(server)
    sock.sendall(
        request("POST", "/?n=1", bodies[0])
        + request("POST", "/?n=2", b'{"small": 1}')
        + request("POST", "/?n=3", bodies[1])
        + request("GET", "/?n=4")
    )
    answers = read_answers(sock, 4)
    sock.close()
    assert [status for status, _, _ in answers] == [200] * 4
    seen = [json.loads(body) for _, _, body in answers]
    assert [answer["query"]["n"] for answer in seen] == [["1"], ["2"], ["3"], ["4"]]
    echoed = [base64.b64decode(seen[i]["contents"][0]["body"]) for i in (0, 2)]
    assert echoed == bodies
    assert base64.b64decode(seen[1]["contents"][0]["body"]) == b'{"small": 1}'


def test_requests_cut_into_random_pieces_around_big_bodies_are_each_read_whole(
    make_server: ServerFactory,
) -> None:
    """The same pipelined stream, written in pieces of random sizes (fixed seeds), so that a
    big body's end, and the head behind it, fall anywhere in a read: every request is read
    whole, with its own bytes."""
    server = make_server("rq_echo")
    for seed in range(5):
        rng = random.Random(seed)
        bodies = [rng.randbytes(size) for size in (300 * 1024, 70 * 1024, 1024 * 1024)]
        stream = b"".join(
            request("POST", f"/?n={n}", body) + request("POST", f"/?n={n}s", b"{}")
            for n, body in enumerate(bodies)
        )
        sock = connect(server)
        sent = 0
        while sent < len(stream):  # some tens of pieces
            piece = rng.choice((1, 7, 1000, 4096, 16384, 65536, 200_000))
            sock.sendall(stream[sent : sent + piece])
            sent += piece
        answers = read_answers(sock, 2 * len(bodies))
        sock.close()
        assert [status for status, _, _ in answers] == [200] * (2 * len(bodies)), seed
        seen = [json.loads(body) for _, _, body in answers]
        assert [answer["query"]["n"][0] for answer in seen] == ["0", "0s", "1", "1s", "2", "2s"]
        echoed = [base64.b64decode(seen[2 * n]["contents"][0]["body"]) for n in range(3)]
        assert echoed == bodies, seed


def test_clients_that_leave_mid_body_hold_nothing(make_server: ServerFactory) -> None:
    """More clients than the front reads bodies at a time (5 for one process) send half of a
    1 MiB body and leave: their places and buffers are given back, and the next big body is
    served."""
    server = make_server("rq_echo")
    for _ in range(20):
        sock = connect(server)
        body = b"x" * (1024 * 1024)
        sock.sendall(request("POST", "/", body)[: 512 * 1024])
        sock.close()
    wait_until(lambda: server.in_flight() == 0, 10, "the requests to stop counting")
    body = bytes(range(256)) * 4096
    answer = server.request("POST", "/", body, {"Content-Type": "application/octet-stream"})
    assert answer.status == 200
    assert base64.b64decode(answer.json()["contents"][0]["body"]) == body


def test_a_call_longer_than_the_keep_alive_timeout_is_answered(
    make_server: ServerFactory,
) -> None:
    """The keep-alive timer closes idle connections only: not one whose call is running."""
    server = make_server("ex_sleep", "--keepalive-timeout", "1")
    sock = connect(server)
    sock.sendall(request("POST", "/?tag=long&sleep=2.5", b"{}"))
    [(status, _, body)] = read_answers(sock, 1)
    assert status == 200 and json.loads(body)["tag"] == "long"
    sock.sendall(request("POST", "/?tag=next", b"{}"))  # and the connection is still usable
    [(status, _, body)] = read_answers(sock, 1)
    sock.close()
    assert status == 200 and json.loads(body)["tag"] == "next"


def test_a_call_after_one_aiohttp_answered_outlives_aiohttp_s_keep_alive_timer(
    make_server: ServerFactory,
) -> None:
    """aiohttp arms its keep-alive timer after each of its own answers; the direct path stops it
    when it takes the next request, whose call then runs past it and is answered."""
    server = make_server("ex_sleep", "--keepalive-timeout", "1")
    sock = connect(server)
    sock.sendall(request("GET", "/health_check"))  # answered by aiohttp's request handling
    [(status, _, _)] = read_answers(sock, 1)
    sock.sendall(request("POST", "/?tag=long&sleep=2.5", b"{}"))
    [(long_status, _, body)] = read_answers(sock, 1)
    sock.close()
    assert (status, long_status, json.loads(body)["tag"]) == (200, 200, "long")


@pytest.mark.parametrize("body", [b"{}", BIG_BODY], ids=["direct", "aiohttp"])
def test_a_client_that_leaves_frees_its_request(make_server: ServerFactory, body: bytes) -> None:
    """Its request stops counting as in flight at once, its call is cancelled in the handler
    process (an ``async def`` handler's task is; a ``def`` handler runs to its end), and the
    next request is served."""
    server = make_server("ex_sleep", "--handler", "main:async_handler")
    sock = connect(server)
    sock.sendall(request("POST", "/?tag=left&sleep=60", body))
    server.wait_for_record(lambda r: '"event": "start", "tag": "left"' in r.get("message", ""))
    assert server.in_flight() == 1
    sock.close()
    wait_until(lambda: server.in_flight() == 0, 10, "the request to stop counting")
    server.wait_for_record(lambda r: '"event": "cancelled", "tag": "left"' in r.get("message", ""))
    answer = server.post_json({}, path="/?tag=after")
    assert answer.status == 200 and json.loads(answer.body)["tag"] == "after"


def test_connection_close_is_honoured(make_server: ServerFactory) -> None:
    server = make_server("ex_sleep")
    sock = connect(server)
    sock.sendall(request("POST", "/?tag=last", b"{}", "Connection: close"))
    [(status, headers, _)] = read_answers(sock, 1)
    assert status == 200
    assert headers.get("Connection") == "close"
    assert sock.recv(1) == b""  # closed by the server
    sock.close()


def test_a_content_type_with_a_line_break_is_a_500_not_a_second_header(
    make_server: ServerFactory,
) -> None:
    server = make_server("rs_table", "--handler", "main:bad")
    answer = server.request("GET", "/?case=content_type_newline")
    assert answer.status == 500
    assert "X-Injected" not in answer.headers
    assert json.loads(answer.body) == {"status": "unexpected error occurred"}


def test_a_header_with_a_control_character_is_a_500_every_time_and_the_connection_serves_on(
    make_server: ServerFactory,
) -> None:
    # The handler process lets it through (only line breaks and NUL are its to refuse); the
    # front checks each answer's head before it writes it, also when it has written that
    # head before.
    server = make_server("rs_table", "--handler", "main:odd_headers")
    sock = connect(server)
    try:
        for case in ("metadata_control", "metadata_tab", "metadata_control", "metadata_tab"):
            sock.sendall(request("GET", f"/?case={case}", b""))
            [(status, headers, body)] = read_answers(sock, 1)
            if case == "metadata_tab":
                assert status == 200 and headers["x-a"] == "a\tb"
            else:
                assert status == 500 and "x-a" not in headers
                assert json.loads(body) == {"status": "unexpected error occurred"}
    finally:
        sock.close()
