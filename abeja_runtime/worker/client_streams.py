"""Streamed answers that a handler process writes to its client itself.

On the front's direct path, a call to a process whose calls run on an event loop comes with its
client's connection (a :class:`~abeja_runtime.frames.Client` frame and its descriptor, just
before the :class:`~abeja_runtime.frames.Call`). If the handler streams, the process writes the
answer's head and each chunk to the client as the generator yields it: no chunk crosses the
front, which would read it, write it again, and take a turn on the core for each. The socket's
own buffer is the stream's window (a slow client holds up its own generator, as credit does on
the front's way). The process says :class:`~abeja_runtime.frames.Answer` ``written`` before its
first byte goes out, and at the end :class:`~abeja_runtime.frames.End` with what it wrote
(:class:`~abeja_runtime.frames.Written`: how it ended, its size, chunks and times), which the
front counts, logs and traces as it does a stream it wrote. The front writes nothing on the
connection from the moment it hands it over until the process is done with the call.

The limits of a stream (``--stream-idle-timeout``, ``--stream-timeout``) are kept here as the
front keeps them (:mod:`abeja_runtime.stream_limits`). A stream cut short (its generator
raised, a limit, the client gone) ends without the body's last chunk: the front closes the
connection, and it ends once this process has closed its copy too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import time
from collections.abc import AsyncGenerator, Callable

from abeja_runtime.frames import STREAM_WINDOW, Answer, BlockingChannel, Client, End, Written
from abeja_runtime.http_head import LAST_CHUNK, Headers, answer_head, chunk, server_line
from abeja_runtime.stream_limits import StreamEnd, StreamIdle, StreamLimits, StreamTooLong
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.invoke import close_stream

__all__ = ["ClientConnections", "write_to_client"]

_log = logging.getLogger("abeja_runtime")


class ClientConnections:
    """The client connections the front handed over, by call id, until their calls are over."""

    __slots__ = ("_by_call",)

    def __init__(self) -> None:
        self._by_call: dict[int, tuple[int, bool]] = {}
        server_line()  # made now, at the start (a package's metadata read), not on a stream's way

    @staticmethod
    def make_room() -> None:
        """A descriptor for each call that runs or waits here: room for as many open files as
        the system lets this process have (a soft limit of 1,024 would drop descriptors at a
        thousand streams, and lose their frames with them)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard:
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    def take_in(self, frame: Client, fd: int | None) -> None:
        if fd is not None:
            self.drop(frame.id)
            self._by_call[frame.id] = (fd, frame.close)

    def take(self, call_id: int) -> tuple[int, bool] | None:
        """Call ``call_id``'s connection and whether its answer ends it, now this caller's to
        close; ``None`` when it came without one."""
        return self._by_call.pop(call_id, None)

    def drop(self, call_id: int) -> None:
        """The call is over without a stream written here: its copy of the connection closed."""
        held = self._by_call.pop(call_id, None)
        if held is not None:
            os.close(held[0])


class _ClientLeft(Exception):
    """A write to the client failed: it left (a reset, a broken pipe)."""


async def write_to_client(
    client: tuple[int, bool],
    call_id: int,
    request_id: str,
    status: int,
    headers: Headers,
    body: AsyncGenerator[bytes, None],
    channel: BlockingChannel,
    cancellations: Cancellations,
    limits: tuple[float | None, float | None],
) -> None:
    """Write the streamed answer ``body`` (its head checked already) to ``client``: its head with
    the first chunk, each chunk as it comes, the body's end; the :class:`End` says what was
    written. The generator is closed, the connection's copy here closed, and the :class:`End`
    sent, however it ends."""
    loop = asyncio.get_running_loop()
    stream = _Stream(client[0], answer_head(status, headers, request_id, None, close=client[1]))
    # Sent before any byte reaches the client: the front must know the answer is written.
    channel.write(Answer(call_id, status, headers, None, True, written=True))
    try:
        with StreamLimits(loop, *limits) as watch:
            stream.end = await stream.write(
                body, watch, lambda: cancellations.is_cancelled(call_id)
            )
    except asyncio.CancelledError:  # the front cancelled the call: nobody waits for it
        stream.end = StreamEnd.CLIENT_LEFT
        raise
    except Exception as exc:
        stream.end = _ended_by(exc)
    finally:
        stream.close()
        try:
            await close_stream(body)
        finally:  # also when cancelled meanwhile: the front waits for it
            channel.write(End(call_id, stream.end == StreamEnd.FAILED, stream.written()))


def _ended_by(exc: Exception) -> StreamEnd:
    """How a stream that ``exc`` ended, ended."""
    if isinstance(exc, _ClientLeft):
        return StreamEnd.CLIENT_LEFT
    if isinstance(exc, StreamIdle):
        return StreamEnd.IDLE
    if isinstance(exc, StreamTooLong):
        return StreamEnd.TOO_LONG
    _log.error("the handler's streamed content failed after the response began: %s", exc)
    return StreamEnd.FAILED


class _Stream:
    """One streamed answer on its way to the client: the connection, the head still to go (with
    the first chunk), and what was written."""

    __slots__ = ("_gaps", "_head", "_last_at", "_sock", "chunks", "end", "first_chunk_at", "size")

    def __init__(self, fd: int, head: bytes) -> None:
        self._sock = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._head = head
        self.end = StreamEnd.FAILED
        self.size = self.chunks = 0
        self.first_chunk_at = self._last_at = 0.0
        self._gaps: list[float] = []

    async def write(
        self, body: AsyncGenerator[bytes, None], watch: StreamLimits, cancelled: Callable[[], bool]
    ) -> StreamEnd:
        """Each chunk as it comes, then the body's end: ``complete``, or ``client_left`` when
        the call was cancelled meanwhile."""
        async for data in body:
            watch.progress()  # a chunk came
            if cancelled():
                return StreamEnd.CLIENT_LEFT
            if not data:
                continue
            now = time.time()
            if self.chunks:
                self._gaps.append(now - self._last_at)
            else:
                self.first_chunk_at = now
            self._last_at = now
            await self._send(self._head + chunk(data))
            self._head = b""
            self.chunks += 1
            self.size += len(data)
            watch.progress()  # the client took it
            if not self.chunks % STREAM_WINDOW:  # a write that never waits does not yield:
                await asyncio.sleep(0)  # the loop's turn (its frames, its other calls)
        await self._send(self._head + LAST_CHUNK)
        return StreamEnd.COMPLETE

    async def _send(self, data: bytes) -> None:
        """``data`` to the client: at once while its socket has room (nearly always: no wait,
        no future), the rest as the client takes it."""
        try:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            if sent < len(data):
                await asyncio.get_running_loop().sock_sendall(self._sock, memoryview(data)[sent:])
        except OSError as exc:
            raise _ClientLeft from exc

    def close(self) -> None:
        """This process's copy of the connection closed (the connection is the front's again);
        a stream cut before its first chunk sends its status line first, as the front's way
        does."""
        if self._head and self.end not in (StreamEnd.COMPLETE, StreamEnd.CLIENT_LEFT):
            with contextlib.suppress(OSError):
                self._sock.send(self._head)
        self._sock.close()

    def written(self) -> Written:
        return Written(self.end, self.size, self.chunks, self.first_chunk_at, tuple(self._gaps))
