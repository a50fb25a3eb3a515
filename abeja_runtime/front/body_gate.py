"""How many request bodies the front holds at once (:class:`BodyGate`).

A body above the inline limit waits, unread, in its socket until a place is free, as ABEJA's Go
proxy left it until it forwarded the request; a request the queue cannot take is refused before
its body is read. A process has its slots (``--concurrency``) plus :data:`BODIES_AHEAD` places:
the bodies of the calls it runs, and of the next ones, read while it runs those (more places
cost memory, fewer cost rate and p99: ``benchmarks --workloads binary_1mib``). A place is taken
before the body is read and given back when its call is over or its reading failed; small
bodies travel in the frame and never wait here.
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
