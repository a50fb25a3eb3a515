"""One call on its way through the front's handler processes (:class:`PendingCall`).

The frame sent, the answer's future, the chunks of a streamed answer, and where it is: in the
queue (``process`` is ``None``) or sent to a :class:`~abeja_runtime.front.processes.
HandlerProcess`. Every way into the front makes one (``calls.py``), the pool moves it
(``pool.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Final

from abeja_runtime.frames import CREDIT_STEP, Answer, Call, Credit, RpcAnswer, RpcCall

if TYPE_CHECKING:
    from abeja_runtime.front.processes import HandlerProcess
    from abeja_runtime.tracing import CallTrace

__all__ = [
    "ANSWER_FILE_ABOVE",
    "STREAM_FAILED",
    "AnswerFile",
    "Batch",
    "PendingCall",
    "StreamIdle",
]

#: An answer's body above this many bytes is written to the client from the handler process's
#: memfd, a piece at a time as the client takes it, rather than read whole into the front: four
#: clients that never read a 200 MiB answer took the front from 39 to 839 MiB.
ANSWER_FILE_ABOVE: Final = 1024 * 1024
#: The size of the pieces it is written in.
_PIECE: Final = 256 * 1024

#: Put in a streamed answer's chunks where it was cut short (the generator raised, the
#: process died).
STREAM_FAILED: Final = object()


class StreamIdle(RuntimeError):
    """A streamed answer sent no chunk for ``--stream-idle-timeout`` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the streamed answer sent nothing for {seconds:g} s and was cut short; the limit "
            "is ABEJA_RUNTIME_STREAM_IDLE_TIMEOUT (--stream-idle-timeout)"
        )


class AnswerFile:
    """A big answer's body, left in the memfd the handler process wrote it to (see
    :data:`ANSWER_FILE_ABOVE`)."""

    __slots__ = ("_fd", "size")

    #: How many are open in this process: each holds a descriptor, which the connection cap
    #: counts (``connection.py``).
    held: ClassVar[int] = 0

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self.size = os.fstat(fd).st_size
        AnswerFile.held += 1

    def pieces(self) -> Iterator[bytes]:
        """The body in pieces, read as they are asked for (``pread``: no mapping that a
        transport could still hold when the file is closed)."""
        offset = 0
        while offset < self.size and self._fd is not None:
            piece = os.pread(self._fd, min(_PIECE, self.size - offset), offset)
            if not piece:
                return
            offset += len(piece)
            yield piece

    async def chunks(self) -> AsyncIterator[bytes]:
        """:meth:`pieces` for the writers of streamed answers, which also write these."""
        for piece in self.pieces():
            yield piece

    def read(self) -> bytes:
        """The whole body (an async request's result, sent in one request)."""
        return b"".join(self.pieces())

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            AnswerFile.held -= 1
            os.close(fd)


class Batch:
    """The calls of a batch (``--max-batch-size``) not answered yet: its process's slot is
    free once none is left."""

    __slots__ = ("left",)

    def __init__(self, size: int) -> None:
        self.left = size


class PendingCall:
    """One call on its way: the frame to send, its answer when it comes, its streamed chunks."""

    __slots__ = (
        "_cleanup", "abandoned", "answer", "answer_file", "batch", "chunks", "fd", "frame",
        "giving_back", "process", "queued_at", "sent_at", "trace", "waited",
    )  # fmt: skip

    def __init__(
        self,
        frame: Call | RpcCall,
        loop: asyncio.AbstractEventLoop,
        fd: int | None = None,
        cleanup: Callable[[], None] | None = None,
        trace: CallTrace | None = None,
    ) -> None:
        self.frame = frame
        #: Its spans in the front (its queue wait is one), when tracing is on.
        self.trace = trace
        self.fd = fd  # sent with the frame (the spool file)
        #: Runs once the call is over (answered, failed, withdrawn): the spool file goes.
        self._cleanup = cleanup
        # The loop is passed, not looked up: on Python 3.11 each lookup is a getpid() call.
        self.answer: asyncio.Future[Answer | RpcAnswer] = loop.create_future()
        self.chunks: asyncio.Queue[Any] | None = None
        #: The body of an answer that came without one (``Answer.body`` is ``None``, and it is
        #: not streamed); whoever writes it closes it.
        self.answer_file: AnswerFile | None = None
        self.abandoned = False
        self.process: HandlerProcess | None = None
        self.sent_at = 0.0
        #: Its process was asked to give it back (it waits there behind a slow call).
        self.giving_back = False
        #: When it joined the queue (:meth:`~abeja_runtime.front.pool.HandlerPool.submit`);
        #: whether its wait there is counted (its handler call began, or it was given up);
        #: and in batch mode the batch it was sent in.
        self.queued_at = 0.0
        self.waited = False
        self.batch: Batch | None = None

    async def stream(self, idle: float | None = None) -> Any:
        """The streamed body's chunks as they come (an async iterator); raises
        ``RuntimeError`` where the handler's generator failed or its process died, and
        :class:`StreamIdle` when no chunk came for ``idle`` seconds.

        Each chunk asked for after the one before was written gives its credit back to the
        handler process (:class:`~abeja_runtime.frames.Credit`, in steps): a client that reads
        slowly holds up its own stream's generator, and the front holds a few of its chunks
        (:data:`~abeja_runtime.frames.STREAM_WINDOW`)."""
        chunks = self.chunks
        assert chunks is not None
        taken = 0
        while True:
            if idle is None or not chunks.empty():
                item = await chunks.get()
            else:
                try:
                    async with asyncio.timeout(idle):
                        item = await chunks.get()
                except TimeoutError:
                    raise StreamIdle(idle) from None
            if item is None:
                return
            if item is STREAM_FAILED:
                raise RuntimeError("the streamed answer was cut short")
            taken += 1
            if taken == CREDIT_STEP:
                taken = 0
                if self.process is not None:
                    self.process.send(Credit(self.frame.id, CREDIT_STEP))
            yield item

    def finish(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def abandon(self) -> None:
        """Nobody waits for the answer any more (timeout, client gone): drop it when it comes."""
        self.abandoned = True
        self.answer.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An answer nobody awaits any more (a crash after the client left) is no "never
    retrieved"."""
    if not future.cancelled():
        future.exception()
