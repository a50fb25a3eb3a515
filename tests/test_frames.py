"""frames.py on its own: frames survive any split, descriptors stay with their frames."""

from __future__ import annotations

import os
import socket

import pytest

from abeja_runtime import frames
from abeja_runtime.frames import Answer, BlockingChannel, Call, Chunk, FrameDecoder, encode_frame

CALL = Call(7, "POST", "/p", "a=1", (("Content-Type", "text/plain"),), "rid", None, b"hi", "", 0)


def test_frames_split_at_every_byte_come_out_whole_and_in_order():
    frames_in = [CALL, Answer(7, 200, (("X", "y"),), b"ok", False), Chunk(7, b"\x00" * 300)]
    data = b"".join(encode_frame(frame) for frame in frames_in)
    decoder = FrameDecoder()
    out = []
    for index in range(len(data)):
        out.extend(decoder.feed(data[index : index + 1], []))
    assert out == [(frame, None) for frame in frames_in]


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
