"""Bodies in shared memory on their own: the front's buffers, and the file a handler reads
from one (a real memfd, mapped as a handler process maps it)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from abeja_runtime.mapped import BodyBuffers, SharedBodies

BODY = b'{"a": 1}\nsecond line\nthird'
MIB = 1024 * 1024


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


def read_only_mappings(fd: int) -> int:
    """How many read-only mappings (a handler process's) of ``fd``'s file this process has, as
    the system lists them; the front's side maps its buffers read-write."""
    status = os.fstat(fd)
    device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}"
    count = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        _, perms, _, mapped_device, inode, *_ = line.split()
        if perms == "r--s" and mapped_device == device and int(inode) == status.st_ino:
            count += 1
    return count


needs_proc_maps = pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="reads the mappings in /proc/self/maps"
)


@needs_proc_maps
def test_a_buffer_the_front_keeps_stays_mapped_for_its_next_body() -> None:
    """The reason to keep it: its next body is read from pages already mapped."""
    buffers, shared = BodyBuffers(), SharedBodies()
    fd = buffers.fill([b"a" * 100], 100)
    shared.open(os.dup(fd), 100).close()
    assert read_only_mappings(fd) == 1
    buffers.release(fd)
    again = buffers.fill([b"b" * 100], 100)
    assert again == fd  # the front's next body in the same buffer
    with shared.open(os.dup(again), 100) as body:
        assert body.read() == b"b" * 100
    assert read_only_mappings(fd) == 1  # the same mapping, not another


@needs_proc_maps
def test_a_buffer_the_front_does_not_keep_is_unmapped_with_its_body() -> None:
    """A buffer above the 32 MiB of free buffers the front keeps is closed there once its call
    is over: kept mapped here, it would hold its memory until the process exits."""
    buffers, shared = BodyBuffers(), SharedBodies()
    size = 33 * MIB
    fd, _ = buffers.take(size)  # its pages are not touched: no memory is used
    body = shared.open(os.dup(fd), size)
    assert read_only_mappings(fd) == 1
    body.close()
    assert read_only_mappings(fd) == 0
    buffers.release(fd)
    assert not _is_open(fd)  # the front does not keep it either


@needs_proc_maps
def test_the_mappings_kept_are_bounded_by_their_bytes() -> None:
    """64 MiB of mappings at most, twice the front's free buffers, however many buffers: the
    least recently used beyond are unmapped (the front holds forty of 2 MiB here)."""
    buffers, shared = BodyBuffers(), SharedBodies()
    many = [buffers.take(2 * MIB)[0] for _ in range(40)]
    for fd in many:
        shared.open(os.dup(fd), 2 * MIB).close()
    assert [read_only_mappings(fd) for fd in many] == [0] * 8 + [1] * 32
    for fd in many:
        buffers.release(fd)
