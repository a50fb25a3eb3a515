"""How the front writes an answer (``front/answers.py``): the rules of an answer's head, as both
ways in write it, and the loop that writes a streamed or file-written answer, over a sink that
records what a transport would be asked to write."""

from __future__ import annotations

import asyncio
import email.utils
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.http import SERVER_SOFTWARE
from helpers.interpreters import printed_by

from abeja_runtime.encode import UNEXPECTED_ERROR
from abeja_runtime.frames import Call
from abeja_runtime.front.answer_file import AnswerFile
from abeja_runtime.front.answers import send_whole, write_stream
from abeja_runtime.front.call import FrontCall, Outcome, Stage
from abeja_runtime.front.pending import STREAM_FAILED, PendingCall
from abeja_runtime.front.service import CallHead, CallService
from abeja_runtime.http_head import EMPTY_BODY_STATUSES, _http_date, answer_head, checked_head
from abeja_runtime.logs import REQUEST_ID_HEADER
from abeja_runtime.metrics import FrontMetrics

from .fakes import FakePool, FakeResponder

JSON = (("Content-Type", "application/json"),)


def lines_of(head: bytes) -> list[str]:
    text = head.decode()
    assert text.endswith("\r\n\r\n"), "a head ends with an empty line"
    return text[: -len("\r\n\r\n")].split("\r\n")


def header_names(head: bytes) -> list[str]:
    return [line.split(":", 1)[0] for line in lines_of(head)[1:]]


def header(head: bytes, name: str) -> str:
    (value,) = [line.split(": ", 1)[1] for line in lines_of(head)[1:] if line.startswith(name)]
    return value


# -- the head --------------------------------------------------------------------------------


def test_a_whole_answer_s_head_has_the_handler_s_headers_then_the_runtime_s() -> None:
    headers = (("Content-Type", "application/json"), ("X-A", "1"), ("x-a", "2"))
    head = answer_head(201, headers, "rid-1", 17, close=False)
    assert lines_of(head)[0] == "HTTP/1.1 201 Created"
    assert header_names(head) == [
        "Content-Type", "X-A", "x-a", REQUEST_ID_HEADER, "Content-Length", "Date", "Server",
    ]  # fmt: skip
    assert lines_of(head)[1:4] == ["Content-Type: application/json", "X-A: 1", "x-a: 2"]
    assert header(head, REQUEST_ID_HEADER) == "rid-1"
    assert header(head, "Content-Length") == "17"
    assert header(head, "Server") == SERVER_SOFTWARE
    date = email.utils.parsedate_to_datetime(header(head, "Date"))
    assert abs(date.timestamp() - time.time()) < 5
    assert header(head, "Date").endswith(" GMT")


@pytest.mark.parametrize(
    "second", [0, 951_782_400, 1_709_164_800, 1_764_374_399, 4_102_444_800, 253_402_300_799]
)
def test_the_date_is_written_as_email_s_formatdate_writes_it(second: int) -> None:
    """The head's Date, made without importing ``email`` (a handler process writes heads):
    the same text, leap days, year ends and the last second of 9999 included."""
    assert _http_date(second) == email.utils.formatdate(second, usegmt=True)


def test_a_handler_process_s_server_line_is_aiohttp_s_without_importing_it() -> None:
    """Where aiohttp is not imported (a handler process that writes its streams), the Server
    line is made from aiohttp's version, and says what aiohttp's own answers say."""
    code = (
        "import sys\n"
        "from abeja_runtime.http_head import server_line\n"
        "print(repr(server_line()))\n"
        "assert 'aiohttp' not in sys.modules\n"
    )
    assert printed_by(code).strip() == repr(f"Server: {SERVER_SOFTWARE}\r\n")


def test_connection_close_is_said_only_when_the_connection_ends() -> None:
    assert "Connection" not in header_names(answer_head(200, JSON, "r", 2, close=False))
    head = answer_head(200, JSON, "r", 2, close=True)
    assert lines_of(head)[-1] == "Connection: close"


def test_a_streamed_head_is_chunked_and_a_file_s_has_its_length() -> None:
    chunked = answer_head(200, JSON, "r", None, close=False)
    assert header(chunked, "Transfer-Encoding") == "chunked"
    assert "Content-Length" not in header_names(chunked)
    sized = answer_head(200, JSON, "r", 3 * 1024 * 1024, close=False)
    assert header(sized, "Content-Length") == str(3 * 1024 * 1024)
    assert "Transfer-Encoding" not in header_names(sized)
    assert header(answer_head(200, JSON, "r", 0, close=False), "Content-Length") == "0"


@pytest.mark.parametrize("status", [100, 101, 199, 204, 304])
@pytest.mark.parametrize("length", [0, 5, None], ids=["empty", "sized", "chunked"])
def test_statuses_without_a_body_have_no_framing(status: int, length: int | None) -> None:
    assert status in EMPTY_BODY_STATUSES
    names = header_names(answer_head(status, (), "r", length, close=False))
    assert "Content-Length" not in names and "Transfer-Encoding" not in names


def test_other_statuses_have_a_body() -> None:
    assert not {200, 201, 205, 299, 301, 302, 400, 500, 599} & EMPTY_BODY_STATUSES


def test_a_status_without_a_reason_phrase_has_an_empty_one() -> None:
    assert lines_of(answer_head(599, (), "r", 0, close=False))[0] == "HTTP/1.1 599 "


@pytest.mark.parametrize(
    "headers",
    [
        (("X-A", "a\r\nX-Injected: 1"),),
        (("X-A", "a\nb"),),
        (("X-A", "a\rb"),),
        (("X-A\r\nX-Injected", "1"),),
        (("X-A", "a\x00b"),),
        (("X-A", "a\x01b"),),
        (("X-A", "a\x1fb"),),
        (("X-A", "a\x7fb"),),
        (("X\x0bA", "1"),),
        (*JSON, ("X-A", "a\x0cb")),
    ],
    ids=["crlf", "lf", "cr", "crlf-name", "nul", "soh", "us", "del", "vt-name", "ff-second"],
)
def test_a_header_with_a_line_break_or_a_control_character_is_refused_every_time(
    headers: tuple[tuple[str, str], ...],
) -> None:
    for _ in range(2):  # the check is cached for good heads only
        with pytest.raises(ValueError, match="line break or a control character"):
            checked_head(200, headers)
        with pytest.raises(ValueError):
            answer_head(200, headers, "r", 0, close=False)


def test_a_tab_and_non_ascii_text_are_fine_in_a_value_but_not_what_cannot_be_encoded() -> None:
    head = answer_head(200, (("X-A", "a\tb"), ("X-B", "caf\u00e9")), "r", 0, close=False)
    assert "X-A: a\tb" in lines_of(head)
    assert "X-B: caf\u00e9".encode() in head  # UTF-8, as aiohttp writes it
    with pytest.raises(ValueError):  # a lone surrogate: UnicodeEncodeError
        checked_head(200, (("X-B", "a\udc80b"),))


# -- whole answers on the direct path ---------------------------------------------------------


class Written:
    """Stands for the connection: what was handed to ``send_direct``."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def send_direct(self, data: bytes, body: bytes = b"") -> None:
        self.sent.append((data, body))


def begun(tmp_path: Path, calls: CallService | None = None) -> FrontCall:
    """A call begun, as a way in begins it."""
    if calls is None:
        calls = service(tmp_path)
    return calls.begin(CallHead("GET", "/", time.time(), "rid-1"), FakeResponder())


def service(tmp_path: Path) -> CallService:
    fake = FakePool()
    metrics = FrontMetrics("test", "main:handler", "abeja", str(tmp_path), lambda: (0, 0))
    return CallService(fake.config, fake.pool, metrics)


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_a_whole_answer_is_counted_and_written_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        connection, call = Written(), begun(tmp_path)
        counts = call.entry
        send_whole(connection, call.entry, 200, JSON, b"{}", close=True)  # type: ignore[arg-type]
        ((head, body),) = connection.sent
        assert body == b"{}" and header(head, "Content-Length") == "2"
        assert lines_of(head)[-1] == "Connection: close"
        assert counts.status == 200

    run(scenario)


def test_a_whole_answer_with_a_bad_header_is_the_runtime_s_500(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        connection, call = Written(), begun(tmp_path)
        counts = call.entry
        headers = (*JSON, ("X-A", "a\x01b"))
        send_whole(connection, call.entry, 200, headers, b"{}", close=False)  # type: ignore[arg-type]
        ((head, body),) = connection.sent
        assert lines_of(head)[0] == "HTTP/1.1 500 Internal Server Error"
        assert body == UNEXPECTED_ERROR.body
        assert header(head, "Content-Length") == str(len(body))
        assert header(head, REQUEST_ID_HEADER) == "rid-1"
        assert "X-A" not in header_names(head)
        assert counts.status == 500  # counted as sent

    run(scenario)
    assert "the handler's answer cannot be sent" in caplog.text


def test_a_whole_answer_without_a_body_status_sends_no_body(tmp_path: Path) -> None:
    async def scenario() -> None:
        connection, call = Written(), begun(tmp_path)
        counts = call.entry
        send_whole(connection, call.entry, 204, (), b"dropped", close=False)  # type: ignore[arg-type]
        ((head, body),) = connection.sent
        assert lines_of(head)[0] == "HTTP/1.1 204 No Content" and body == b""
        assert counts.status == 204

    run(scenario)


# -- streamed and file-written answers ---------------------------------------------------------


class Sink:
    """An answer sink that records what it was asked to do (``lost``: the client is gone)."""

    def __init__(self, lost: bool = False) -> None:
        self.done: list[tuple[Any, ...]] = []
        self.lost = lost

    async def start(
        self, status: int, headers: tuple[tuple[str, str], ...], request_id: str, length: int | None
    ) -> None:
        self.done.append(("start", status, headers, request_id, length))

    async def write(self, chunk: bytes) -> None:
        if self.lost:
            raise ConnectionResetError("gone")
        self.done.append(("write", chunk))

    async def end(self) -> None:
        self.done.append(("end",))

    def cut(self) -> None:
        self.done.append(("cut",))


def streamed(calls: CallService, *items: Any) -> FrontCall:
    """A call whose streamed answer's chunks are ``items``."""
    call = begun(Path(), calls)
    frame = Call(call.id, "GET", "/", "", (), "rid-1", None, b"", "", 0)
    pending = call.ticket = PendingCall(frame, calls.loop)
    pending.chunks = asyncio.Queue()
    for item in items:
        pending.chunks.put_nowait(item)
    return call


def test_a_stream_is_written_chunk_by_chunk_and_ended(tmp_path: Path) -> None:
    async def scenario() -> None:
        calls = service(tmp_path)
        sink, call = Sink(), streamed(calls, b"a", b"b", None)
        counts = call.entry
        assert await write_stream(sink, call, 200, JSON)
        assert sink.done == [
            ("start", 200, JSON, "rid-1", None), ("write", b"a"), ("write", b"b"), ("end",),
        ]  # fmt: skip
        assert counts.status == 200 and counts.first_byte > 0  # counted when it ends

    run(scenario)


def test_a_stream_cut_short_is_cut_and_withdrawn(tmp_path: Path) -> None:
    async def scenario() -> None:
        calls = service(tmp_path)
        sink, call = Sink(), streamed(calls, b"a", STREAM_FAILED)
        assert not await write_stream(sink, call, 200, JSON)
        assert sink.done[-2:] == [("write", b"a"), ("cut",)]
        assert call.ticket is not None and call.ticket.abandoned
        assert call.outcome is Outcome.CUT

    run(scenario)


def test_a_stream_whose_client_left_is_abandoned(tmp_path: Path) -> None:
    async def scenario() -> None:
        calls = service(tmp_path)
        sink, call = Sink(lost=True), streamed(calls, b"a", None)
        assert not await write_stream(sink, call, 200, JSON)
        assert ("end",) not in sink.done and ("cut",) not in sink.done
        assert call.ticket is not None and call.ticket.abandoned
        assert (call.stage, call.outcome) == (Stage.DONE, Outcome.CLIENT_LEFT)

    run(scenario)


def test_a_stream_with_a_bad_header_is_the_runtime_s_500_and_withdrawn(tmp_path: Path) -> None:
    async def scenario() -> None:
        calls = service(tmp_path)
        sink, call = Sink(), streamed(calls, b"a", None)
        counts = call.entry
        headers = (*JSON, ("X-A", "a\nb"))
        assert await write_stream(sink, call, 200, headers)
        body = UNEXPECTED_ERROR.body
        assert isinstance(body, bytes)
        assert sink.done == [
            ("start", 500, UNEXPECTED_ERROR.headers, "rid-1", len(body)), ("write", body),
            ("end",),
        ]  # fmt: skip
        assert counts.status == 500 and counts.first_byte == 0  # not a stream
        assert call.ticket is not None and call.ticket.abandoned

    run(scenario)


def test_a_big_answer_is_written_from_its_file_with_its_length_and_the_file_closed(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        calls = service(tmp_path)
        data = bytes(range(256)) * 4096  # four pieces
        fd = os.memfd_create("answer")
        os.write(fd, data)
        call = begun(tmp_path, calls)
        frame = Call(call.id, "GET", "/", "", (), "rid-1", None, b"", "", 0)
        pending = call.ticket = PendingCall(frame, calls.loop)
        pending.answer_file = AnswerFile(fd)
        sink = Sink()
        assert await write_stream(sink, call, 200, JSON)
        assert sink.done[0] == ("start", 200, JSON, "rid-1", len(data))
        assert b"".join(step[1] for step in sink.done if step[0] == "write") == data
        assert sink.done[-1] == ("end",)
        with pytest.raises(OSError):
            os.fstat(fd)  # closed

    run(scenario)
