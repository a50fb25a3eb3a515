"""A request's body as the front holds it (:class:`Body`): in the call frame, in one of the
front's memfds, or in a spool file (the last two sent to the handler process as their
descriptor), with the place it holds in the body gate (:class:`BodyPlaces`)."""

from __future__ import annotations

import asyncio
import mmap
import time
from typing import IO, TYPE_CHECKING, Final

from abeja_runtime.config import Config
from abeja_runtime.errors import BodyPastDeadline, HandlerTimeout, ServiceBusy
from abeja_runtime.front.body_gate import BODIES_AHEAD, BodyGate
from abeja_runtime.mapped import BodyBuffers
from abeja_runtime.spool import Scratch

if TYPE_CHECKING:
    from abeja_runtime.front.pool import HandlerPool

__all__ = ["IN_FRAME", "Body", "BodyPlaces"]


class Body:
    """A request body read whole: in the frame, in one of the front's memfds, or in a spool
    file (the last two sent as their descriptor)."""

    __slots__ = ("buffers", "data", "fd", "file", "gate", "scratch", "size")

    def __init__(
        self,
        data: bytes | None,
        *,
        fd: int | None = None,
        size: int = 0,
        buffers: BodyBuffers | None = None,
        file: IO[bytes] | None = None,
        scratch: Scratch | None = None,
    ) -> None:
        self.data = data
        self.fd = fd if file is None else file.fileno()
        self.size = size
        self.buffers = buffers
        self.file = file
        self.scratch = scratch
        #: Where its place is given back, for a body that took one.
        self.gate: BodyGate | None = None

    def close(self) -> None:
        """Give back what it holds (once: a second call does nothing)."""
        if self.gate is not None:
            self.gate.leave()
            self.gate = None
        if self.buffers is not None and self.fd is not None:
            self.buffers.release(self.fd)
            self.buffers = None
        if self.file is not None:
            self.file.close()
        if self.scratch is not None:
            self.scratch.remove()


#: The body of a call whose body travels in its frame.
IN_FRAME: Final = Body(None)


class BodyPlaces:
    """The places of bodies above the inline limit (:attr:`gate`), and the shared buffers they
    are read into (:attr:`buffers`), as every way in takes them."""

    __slots__ = ("_pool", "_timeout", "buffers", "gate")

    def __init__(self, config: Config, pool: HandlerPool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._timeout = config.timeout or None
        self.buffers = BodyBuffers()
        self.gate = BodyGate(config.workers * (config.concurrency + BODIES_AHEAD), loop)

    def may_read(self) -> bool:
        """Whether a body may be read now or wait for a place: else the queue could not take
        its call, and it is refused (``503``) before it is read."""
        return self.gate.waiting < self._pool.free_places()

    async def enter(self) -> None:
        """A place, waiting for one if all are held; the wait counts as waiting in the queue,
        and ends at the request's deadline (``504``); ``503`` at once when the queue could not
        take the call."""
        gate = self.gate
        if not self.may_read():
            raise ServiceBusy()
        if gate.try_enter():
            return
        try:
            async with asyncio.timeout(self._timeout):
                await gate.enter()
        except TimeoutError:
            raise HandlerTimeout(self._timeout or 0) from None

    def held(self, size: int) -> tuple[Body, mmap.mmap]:
        """A shared buffer for a body of ``size`` bytes whose place is held; the mapping is the
        buffer's, to fill, and the body's ``close()`` gives both back."""
        try:
            fd, mapped = self.buffers.take(size)
        except BaseException:  # no memory or descriptor for it: the place is given back
            self.gate.leave()
            raise
        body = Body(None, fd=fd, size=size, buffers=self.buffers)
        body.gate = self.gate
        return body, mapped

    def time_left(self, received: float) -> float | None:
        """Seconds to the deadline of a call received at ``received`` (``None``: none)."""
        if self._timeout is None:
            return None
        return max(0.0, received + self._timeout - time.time())

    def past_deadline(self) -> BodyPastDeadline:
        """The error of a body still arriving at its request's deadline."""
        return BodyPastDeadline(self._timeout or 0)
