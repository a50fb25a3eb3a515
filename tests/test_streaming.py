"""Streamed answers, over real HTTP: each chunk reaches the client as it is produced, from sync
and async generators alike, on both ways in; the access record covers the whole stream, with
the time to its first byte (issue 29 point 2).

"As it is produced" is tested without a clock: the generator's second chunk waits for a file
that the test creates only once it has read the first one. A front that held the stream back
would leave the test waiting for ever (its socket's timeout fails it instead).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ServerFactory, wait_until
from test_cancellation import chunked_post, get, read_until, records_of, send_and_leave


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
    said = server.wait_for_record(lambda r: "sent nothing for 1 s" in r.get("message", ""))
    assert said["log_level"] == "warning" and "(request silent)" in said["message"]
