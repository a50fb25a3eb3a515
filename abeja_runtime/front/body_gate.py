"""How many request bodies the front holds at once.

Without a bound the front read every body it was sent as soon as it came, and held each one
(in a buffer of shared memory, or a spool file) until its call was over, and only then asked
whether the queue had room: a burst of a thousand 1 MiB uploads to one handler process was read
whole, a gigabyte, to answer most of it ``503``. Now a body waits, unread, in the socket (and
the client's send buffer) until a place is free, as ABEJA's Go proxy left it until it forwarded
the request; a request the queue cannot take is refused before its body is read.

A process has its slots (``--concurrency``) plus :data:`BODIES_AHEAD` places: the bodies of the
calls it runs, and of the next ones, read while it runs those. Only bodies above the inline
limit take a place: small bodies travel in the frame, and a request without a body never waits
here. A place is taken before the body is read and given back when its call is over (answered,
failed or withdrawn) or its reading failed.

Measured with one process on one core, sixteen clients sending 1 MiB each (``python -m
benchmarks --workloads binary_1mib``), against a bare aiohttp app: with 17 places 1.06x its
rate and 1.68x its memory (RSS: each body counted in both processes, the front's buffer mapped
in the handler process); with 5, 1.04-1.07x and 1.38-1.39x; with 3, 1.03x, but a p99 latency
of 1.30x. Before the bodies waiting for a place were left in the socket, fewer places cost a
fifth of the rate: each waiting body filled the parser's buffers, and was read through them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Final

__all__ = ["BODIES_AHEAD", "BodyGate"]

#: Places per handler process beyond its slots (see the module's docstring).
BODIES_AHEAD: Final = 4


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
