"""Bodies in shared memory on their own: the front's buffers, and the file a handler reads
from one (a real memfd, mapped as a handler process maps it)."""

from __future__ import annotations

import io
import json
import os

import pytest

from abeja_runtime.mapped import BodyBuffers, SharedBodies

BODY = b'{"a": 1}\nsecond line\nthird'


def opened(buffers: BodyBuffers, chunks: list[bytes]) -> io.RawIOBase:
    """``chunks`` written by the front's side, opened as a handler process opens them."""
    size = sum(map(len, chunks))
    fd = buffers.fill(chunks, size)
    return SharedBodies().open(os.dup(fd), size)  # type: ignore[return-value]


def test_the_body_reads_as_a_binary_file() -> None:
    body = opened(BodyBuffers(), [BODY[:5], BODY[5:]])
    assert body.read(4) == BODY[:4]
    assert body.tell() == 4
    assert body.readline() == BODY[4:9]
    assert body.read() == BODY[9:]  # to the body's end, not the buffer's (1 MiB)
    assert body.read() == b""
    assert body.seek(0) == 0
    assert list(body) == [b'{"a": 1}\n', b"second line\n", b"third"]
    body.seek(-5, io.SEEK_END)
    assert body.read(100) == b"third"
    body.seek(0)
    assert json.loads(body.readline()) == {"a": 1}


def test_json_load_reads_it_whole() -> None:
    body = opened(BodyBuffers(), [b'{"x": [1, 2, 3]}'])
    assert json.load(body) == {"x": [1, 2, 3]}  # type: ignore[arg-type]


def test_a_closed_body_cannot_be_read() -> None:
    """The front reuses the buffer once the call is answered: reading after the call fails
    as on any closed file, never with another request's bytes."""
    body = opened(BodyBuffers(), [BODY])
    body.close()
    with pytest.raises(ValueError, match="closed file"):
        body.read()
    with pytest.raises(ValueError, match="closed file"):
        body.seek(0)


def test_a_released_buffer_serves_the_next_body() -> None:
    buffers = BodyBuffers()
    first = buffers.fill([b"x" * 100], 100)
    buffers.release(first)
    second = buffers.fill([b"y" * 10], 10)
    assert second == first  # the same memfd, written again
    body = SharedBodies().open(os.dup(second), 10)
    assert body.read() == b"y" * 10


def test_buffers_beyond_what_is_kept_are_closed() -> None:
    buffers = BodyBuffers()
    many = [buffers.fill([b"z"], 1) for _ in range(40)]  # 40 MiB of 1 MiB buffers
    for fd in many:
        buffers.release(fd)
    kept = [fd for fd in many if _is_open(fd)]
    assert len(kept) == 32  # 32 MiB kept for the next bodies; the rest closed


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
