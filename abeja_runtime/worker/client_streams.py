"""Streamed answers that a handler process writes to its client itself.

On the front's direct path, a call to a process whose calls run on an event loop comes with its
client's connection (a :class:`~abeja_runtime.frames.Client` frame and its descriptor, just
before the :class:`~abeja_runtime.frames.Call`). A streamed answer's head and chunks go to the
client from here as the generator yields them, none through the front; the socket's own buffer
is the stream's window. :class:`~abeja_runtime.frames.Answer` ``written`` goes to the front
before the first byte to the client, and :class:`~abeja_runtime.frames.End` with what was
written (:class:`~abeja_runtime.frames.Written`) at the end, for the front to count, log and
trace; the front writes nothing on the connection until the process is done with the call.

The stream's limits are kept here as the front keeps them
(:mod:`abeja_runtime.stream_limits`). A stream cut short (its generator raised, a limit, the
client gone) ends without the body's last chunk: the front closes the connection, which ends
once this process has closed its copy too.
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

from abeja_runtime.encode import EncodedResponse
from abeja_runtime.frames import STREAM_WINDOW, Answer, BlockingChannel, Client, End, Written
from abeja_runtime.http_head import EMPTY_BODY_STATUSES, LAST_CHUNK, answer_head, chunk, server_line
from abeja_runtime.logs import request_id_var
from abeja_runtime.stream_limits import StreamEnd, StreamIdle, StreamLimits, StreamTooLong
from abeja_runtime.worker.cancellation import Cancellations
from abeja_runtime.worker.invoke import close_stream

__all__ = ["ClientConnections"]

_log = logging.getLogger("abeja_runtime")


class ClientConnections:
    """The client connections the front lent, by call id, until their calls are over."""

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

    def drop(self, call_id: int) -> None:
        """The call is over without a stream written here: its copy of the connection closed."""
        held = self._by_call.pop(call_id, None)
        if held is not None:
            os.close(held[0])

    async def write(
        self,
        call_id: int,
        reply: EncodedResponse,
        body: AsyncGenerator[bytes, None],
        channel: BlockingChannel,
        cancellations: Cancellations,
        limits: tuple[float | None, float | None],
    ) -> bool:
        """Write the streamed answer ``body`` to the connection lent with call ``call_id``: its
        head with the first chunk, each chunk as it comes, the body's end; the :class:`End` says
        what was written. The generator is closed, the connection's copy here closed, and the
        :class:`End` sent, however it ends. ``False`` (nothing done) when the call came without
        a connection; also, its copy closed, when the answer has no body or a head that cannot
        be sent (the front answers that one's ``500``)."""
        client = self._by_call.pop(call_id, None)
        if client is None:
            return False
        request_id = request_id_var.get() or ""
        try:
            head = answer_head(reply.status, reply.headers, request_id, None, close=client[1])
        except ValueError:
            head = b""
        if not head or reply.status in EMPTY_BODY_STATUSES:
            os.close(client[0])
            return False
        stream = _Stream(client[0], head)
        # Sent before any byte reaches the client: the front must know the answer is written.
        channel.write(Answer(call_id, reply.status, reply.headers, None, True, written=True))
        try:
            with StreamLimits(asyncio.get_running_loop(), *limits) as watch:
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
        return True


class _ClientLeft(Exception):
    """A write to the client failed: it left (a reset, a broken pipe)."""


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
