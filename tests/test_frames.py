"""frames.py on its own: each frame class has a kind of its own, frames survive any split,
descriptors stay with their frames."""

from __future__ import annotations

import os
import socket
import typing
from collections import deque
from typing import Any

import pytest

from abeja_runtime import frames
from abeja_runtime.frames import (
    Answer,
    BlockingChannel,
    Call,
    Cancel,
    Chunk,
    Credit,
    FrameDecoder,
    FrameKind,
    GiveBack,
    ProtocolError,
    encode_frame,
    header_text,
)

CALL = Call(7, "POST", "/p", "a=1", ((b"Content-Type", b"text/plain"),), "rid", None, b"hi", "", 0)


def test_frames_split_at_every_byte_come_out_whole_and_in_order():
    frames_in = [CALL, Answer(7, 200, (("X", "y"),), b"ok", False), Chunk(7, b"\x00" * 300)]
    data = b"".join(encode_frame(frame) for frame in frames_in)
    decoder = FrameDecoder()
    out = []
    for index in range(len(data)):
        out.extend(decoder.feed(data[index : index + 1], []))
    assert out == [(frame, None) for frame in frames_in]


FRAME_CLASSES = typing.get_args(frames.Frame)


def test_header_lines_travel_as_bytes_and_are_read_as_aiohttp_reads_them():
    """Every line, a name sent twice included, in order; UTF-8, and a byte that is not kept as
    a lone surrogate (aiohttp's ``surrogateescape``), so that nothing is lost or refused."""
    raw = ((b"X-A", b"1"), (b"x-a", b"2"), (b"X-Name", "\u00e9".encode() + b"\xff"))
    (decoded,) = FrameDecoder().feed(encode_frame(CALL._replace(headers=raw)), [])
    assert header_text(decoded[0].headers) == [
        ("X-A", "1"),
        ("x-a", "2"),
        ("X-Name", "\u00e9\udcff"),
    ]


def test_every_frame_class_has_a_kind_of_its_own_and_every_kind_a_class():
    kinds = [frames._KIND_OF[cls] for cls in FRAME_CLASSES]
    assert len(set(kinds)) == len(kinds) == len(FRAME_CLASSES)
    assert sorted(kinds) == sorted(FrameKind)
    assert all(frames._KINDS[kind] is cls for kind, cls in zip(kinds, FRAME_CLASSES, strict=True))


@pytest.mark.parametrize("cls", FRAME_CLASSES, ids=lambda cls: cls.__name__)
def test_a_frame_goes_out_with_its_kind_and_comes_back_as_its_class(cls):
    frame = cls._make(range(len(cls._fields)))
    data = encode_frame(frame)
    assert data[1] == frames._KIND_OF[cls]
    assert FrameKind(data[1]).name.replace("_", "") == cls.__name__.upper()
    assert FrameDecoder().feed(data, []) == [(frame, None)]


def test_a_kind_byte_that_is_no_frame_class_is_a_protocol_error():
    data = bytearray(encode_frame(Cancel(1)))
    data[1] = len(FrameKind)
    with pytest.raises(ProtocolError, match="bytes that are not a frame"):
        FrameDecoder().feed(bytes(data), [])


def test_descriptors_travel_with_their_frames():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        receiver = BlockingChannel(theirs)
        sender = BlockingChannel(ours)
        readable, writable = os.pipe()
        with os.fdopen(writable, "wb") as pipe:
            pipe.write(b"body")
        sender.write(Chunk(1, b"before"))
        sender.write(CALL._replace(body=None, body_size=4), readable)
        os.close(readable)
        first = receiver.read()
        second = receiver.read()
    assert first == (Chunk(1, b"before"), None)
    assert second is not None and second[0].id == 7
    fd = second[1]
    assert fd is not None
    with os.fdopen(fd, "rb") as received:
        assert received.read() == b"body"


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_protocol_error_closes_the_descriptors_of_the_frames_read_before_it():
    """A frame with its descriptor, then bytes that are no frame, in one read: nobody gets the
    frame (the read raised), so its descriptor is closed rather than lost open."""
    readable, writable = os.pipe()
    os.close(writable)
    data = encode_frame(CALL._replace(body=None), has_fd=True) + b"not a frame at all......"
    with pytest.raises(ProtocolError, match="bytes that are not a frame"):
        FrameDecoder().feed(data, [readable])
    assert not is_open(readable)


def test_credit_goes_to_its_stream_and_cancel_is_said_as_it_is_read():
    """Credit is given to ``granted`` by whichever read takes it in, never returned by read();
    a Cancel is said to ``cancelled`` at once and still read in order (a call waiting behind
    it is taken back)."""
    granted: list[tuple[int, int, int]] = []
    cancelled: list[int] = []
    ours, theirs = socket.socketpair()
    with ours, theirs:
        receiver = BlockingChannel(
            theirs, None, cancelled.append, lambda i, n, size: granted.append((i, n, size))
        )
        sender = BlockingChannel(ours)
        for frame in (Credit(3, 4, 4096), CALL, Cancel(5), Credit(3, 4, 4096)):
            sender.write(frame)
        assert receiver.read() == (CALL, None)
        assert granted == [(3, 4, 4096), (3, 4, 4096)] and cancelled == [5]
        assert receiver.read() == (Cancel(5), None)


def test_waiting_until_reads_frames_until_it_is_done_or_the_socket_closes():
    """A stream waiting for credit on the reading thread takes in what comes: its credit, the
    calls the front takes back meanwhile (given back at once: nobody else can read), and the
    rest kept in order for the next read."""
    granted: list[tuple[int, int, int]] = []
    given_back: list[int] = []
    other = CALL._replace(id=8)
    ours, theirs = socket.socketpair()
    with theirs:
        receiver = BlockingChannel(
            theirs, None, None, lambda i, n, size: granted.append((i, n, size))
        )
        sender = BlockingChannel(ours)
        for frame in (CALL, other, GiveBack(8), Credit(3, 4, 4096)):
            sender.write(frame)

        def give_back(frame: Any, fd: int | None) -> None:
            given_back.append(frame.id)

        assert receiver.wait_until(lambda: bool(granted), give_back)
        assert granted == [(3, 4, 4096)] and given_back == [8]
        assert receiver.read() == (CALL, None)  # kept, in order, for the next read
        ours.close()
        assert not receiver.wait_until(lambda: False, give_back)


def test_reading_what_is_ready_takes_all_the_socket_holds_and_then_its_end():
    """An event loop's read (``read_ready``) takes every frame the socket holds, without
    waiting, and says the socket ended in the same read when the end came behind them: uvloop
    calls a reader once for an error and stops watching, so the end must not wait for a later
    call. (The frames fit the socket's buffer: nothing reads while they are written.)"""
    many = [CALL._replace(id=index, body=b"x" * 10_000) for index in range(8)]
    ours, theirs = socket.socketpair()
    with theirs:
        receiver = BlockingChannel(theirs)
        assert receiver.read_ready() == (deque(), True)  # nothing yet: no wait
        sender = BlockingChannel(ours)
        for frame in many:
            sender.write(frame)
        ours.close()
        frames, still_open = receiver.read_ready()
        assert [frame for frame, _ in frames] == many and not still_open


def test_an_anonymous_file_without_memfds_leaves_no_name_behind(monkeypatch, tmp_path):
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(frames.tempfile, "tempdir", None)
    fd = frames.anonymous_file()
    try:
        assert os.write(fd, b"data") == 4
        assert os.pread(fd, 4, 0) == b"data"
        assert list(tmp_path.iterdir()) == []
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 1, 200_000])
def test_memfd_holds_the_chunks_from_offset_zero(size):
    fd = frames.memfd([b"a" * size, b"b"])
    assert frames.read_fd(fd) == b"a" * size + b"b"
