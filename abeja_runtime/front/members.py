"""The pool's record of each handler process (:class:`Member`): its handle, where it is in its
life, and the calls it was sent.

The handle (:class:`~abeja_runtime.front.processes.HandlerProcess`) is the process itself: its
start, its socket, its frames, its end. What the pool decides about it lives here, off the
handle: its :class:`ProcessState` and the lifecycle's marks (``lifecycle.py``), the calls sent
and the scheduler's timers (``scheduler.py``). So a fake handle in the unit tests needs none of
it.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import TYPE_CHECKING

from abeja_runtime.frames import Frame, ProtocolError

if TYPE_CHECKING:
    from abeja_runtime.front.pending import PendingCall
    from abeja_runtime.front.processes import HandlerProcess

__all__ = ["Member", "ProcessState"]


class ProcessState(enum.Enum):
    """Where a handler process is in its life."""

    #: Loading the handler: no call yet.
    STARTING = "starting"
    #: Takes calls.
    READY = "ready"
    #: Takes no more calls; finishes once those it has are answered (retired, recycled, or
    #: the front stops).
    STOPPING = "stopping"


class Member:
    """One handler process of the pool, and what the pool keeps of it. It is the sink of its
    handle's frames (:class:`~abeja_runtime.front.processes.FrameSink`): each goes to the
    pool with this record."""

    __slots__ = (
        "_broken", "_received", "answered", "answered_at", "batches", "process", "replaces",
        "request_limit", "retiring", "sent", "state", "take_back_timer",
    )  # fmt: skip

    def __init__(
        self,
        received: Callable[[Member, Frame, int | None], None],
        broken: Callable[[Member, ProtocolError], None],
    ) -> None:
        self._received = received
        self._broken = broken
        #: Set once its process is started (``Lifecycle.spawn``).
        self.process: HandlerProcess
        self.state = ProcessState.STARTING
        #: Calls sent and not answered, in the order they were sent.
        self.sent: dict[int, PendingCall] = {}
        #: Calls it answered, and when its last answer came: its next call was busy from then
        #: or from when it was sent, whichever is later.
        self.answered = 0
        self.answered_at = 0.0
        #: When to look whether calls wait behind a slow one here (``scheduler.py``).
        self.take_back_timer: asyncio.TimerHandle | None = None
        #: Batches it runs (batch mode: at most ``concurrency``).
        self.batches = 0
        #: The calls it serves before it is retired (``--max-requests``, spread a little).
        self.request_limit: int | None = None
        #: Its replacement is starting (it serves until that one is ready).
        self.retiring = False
        #: The retiring member it replaces, until it is ready.
        self.replaces: Member | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, frame: Frame, fd: int | None = None) -> None:
        self.process.send(frame, fd)

    def received(self, frame: Frame, fd: int | None) -> None:
        self._received(self, frame, fd)

    def broken(self, exc: ProtocolError) -> None:
        self._broken(self, exc)

    def oldest_call_age(self, now: float) -> float | None:
        for pending in self.sent.values():
            return now - pending.sent_at
        return None
