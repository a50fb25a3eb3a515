"""One call on its way through the front's handler processes (:class:`PendingCall`).

The frame sent, the answer's future, the chunks of a streamed answer, and where it is: in the
queue (``process`` is ``None``) or sent to a :class:`~abeja_runtime.front.processes.
HandlerProcess`. Every way into the front makes one (``calls.py``), the pool moves it
(``pool.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from abeja_runtime.frames import Answer, Call, RpcAnswer, RpcCall

if TYPE_CHECKING:
    from abeja_runtime.front.processes import HandlerProcess

__all__ = ["STREAM_FAILED", "PendingCall", "StreamIdle"]

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


class PendingCall:
    """One call on its way: the frame to send, its answer when it comes, its streamed chunks."""

    __slots__ = (
        "_cleanup", "abandoned", "answer", "chunks", "fd", "frame", "giving_back", "process",
        "sent_at",
    )  # fmt: skip

    def __init__(
        self,
        frame: Call | RpcCall,
        loop: asyncio.AbstractEventLoop,
        fd: int | None = None,
        cleanup: Callable[[], None] | None = None,
    ) -> None:
        self.frame = frame
        self.fd = fd  # sent with the frame (the spool file)
        #: Runs once the call is over (answered, failed, withdrawn): the spool file goes.
        self._cleanup = cleanup
        # The loop is passed, not looked up: on Python 3.11 each lookup is a getpid() call.
        self.answer: asyncio.Future[Answer | RpcAnswer] = loop.create_future()
        self.chunks: asyncio.Queue[Any] | None = None
        self.abandoned = False
        self.process: HandlerProcess | None = None
        self.sent_at = 0.0
        #: Its process was asked to give it back (it waits there behind a slow call).
        self.giving_back = False

    async def stream(self, idle: float | None = None) -> Any:
        """The streamed body's chunks as they come (an async iterator); raises
        ``RuntimeError`` where the handler's generator failed or its process died, and
        :class:`StreamIdle` when no chunk came for ``idle`` seconds."""
        chunks = self.chunks
        assert chunks is not None
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
            process = self.process
            if process is not None and chunks.qsize() < 2:
                process.resume()
            yield item

    def finish(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def abandon(self) -> None:
        """Nobody waits for the answer any more (timeout, client gone): drop it when it comes."""
        self.abandoned = True
        self.answer.add_done_callback(_retrieve)
        if self.process is not None:
            self.process.resume()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An answer nobody awaits any more (a crash after the client left) is no "never
    retrieved"."""
    if not future.cancelled():
        future.exception()
