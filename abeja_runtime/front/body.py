"""A request's body as the front holds it (:class:`Body`), and the places bodies take.

A body travels in the call frame, in one of the front's memfds, or in a spool file (the last two
sent to the handler process as their descriptor). A body above the inline limit waits, unread,
in its socket until a place is free (:class:`BodyGate`), as ABEJA's Go proxy left it until it
forwarded the request; a request the queue cannot take is refused before its body is read. A
process has its slots (``--concurrency``) plus :data:`BODIES_AHEAD` places: the bodies of the
calls it runs, and of the next ones, read while it runs those (more places cost memory, fewer
cost rate and p99: ``benchmarks --workloads binary_1mib``). A place is taken before the body is
read and given back when its call is over or its reading failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import time
from collections import deque
from typing import IO, TYPE_CHECKING, Final

from abeja_runtime.config import Config
from abeja_runtime.errors import BodyPastDeadline, HttpError, ServiceBusy, deadline_passed
from abeja_runtime.mapped import BodyBuffers
from abeja_runtime.spool import Scratch

if TYPE_CHECKING:
    from abeja_runtime.front.pool import HandlerPool

__all__ = ["BODIES_AHEAD", "IN_FRAME", "Body", "BodyGate", "BodyPlaces"]

#: Places per handler process beyond its slots (see the module's docstring).
BODIES_AHEAD: Final = 4


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

    async def enter(self, deadline: float | None, budget: float) -> None:
        """A place, waiting for one if all are held; the wait counts as waiting in the queue,
        and ends at the call's ``deadline`` (``504``; ``budget``: the seconds its caller gave,
        when they set it); ``503`` at once when the queue could not take the call."""
        gate = self.gate
        if not self.may_read():
            raise ServiceBusy()
        if gate.try_enter():
            return
        try:
            async with asyncio.timeout(self.time_left(deadline)):
                await gate.enter()
        except TimeoutError:
            raise self.not_placed_in_time(budget) from None

    def not_placed_in_time(self, budget: float) -> HttpError:
        """The ``504`` of a body whose call's deadline passed while it waited for a place (the
        one its caller gave, ``budget`` seconds, or ``--timeout``'s)."""
        return deadline_passed(budget, self._timeout or 0)

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

    @staticmethod
    def time_left(deadline: float | None) -> float | None:
        """Seconds to a call's ``deadline`` (``time.time()``; ``None``: none)."""
        return None if deadline is None else max(0.0, deadline - time.time())

    def past_deadline(self, budget: float) -> BodyPastDeadline:
        """The error of a body still arriving at its call's deadline: the one its caller gave
        (``budget`` seconds), or ``--timeout``'s."""
        return BodyPastDeadline(budget or self._timeout or 0, callers=bool(budget))


class BodyGate:
    """``places`` bodies at most, the others wait their turn in arrival order."""

    __slots__ = ("_held", "_loop", "_places", "_waiting")

    def __init__(self, places: int, loop: asyncio.AbstractEventLoop) -> None:
        self._places = places
        self._held = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop = loop

    @property
    def waiting(self) -> int:
        """Bodies waiting for a place (they count as queued calls)."""
        return len(self._waiting)

    def has_place(self) -> bool:
        """Whether :meth:`enter` would return at once."""
        return self._held < self._places and not self._waiting

    def try_enter(self) -> bool:
        """Take a place if one is free now, without waiting: whether one was taken."""
        if self.has_place():
            self._held += 1
            return True
        return False

    async def enter(self) -> None:
        """Take a place, waiting for one if all are held. Cancelled while waiting (the
        deadline, the client gone), nothing is held; a place handed over meanwhile goes on."""
        if self.try_enter():
            return
        turn = self.wait()
        try:
            await turn
        except asyncio.CancelledError:
            self.give_up(turn)
            raise

    def wait(self) -> asyncio.Future[None]:
        """A turn in the line: done when a place is handed to it (the place is then held);
        :meth:`give_up` when it is no longer wanted."""
        turn = self._loop.create_future()
        self._waiting.append(turn)
        return turn

    def give_up(self, turn: asyncio.Future[None]) -> None:
        """The turn is not wanted (the deadline, the client gone): nothing is held after, even
        when a place was handed to it just now."""
        if turn.done() and not turn.cancelled():
            self.leave()
            return
        turn.cancel()
        with contextlib.suppress(ValueError):  # ``leave`` may have dropped it already
            self._waiting.remove(turn)

    def leave(self) -> None:
        """Give a place back: to the first body still waiting, else to the free places."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._held -= 1
