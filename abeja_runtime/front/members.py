"""The pool's record of each handler process (:class:`Member`): where it is in its life and the
calls it was sent, kept off the process's handle (``processes.py``) so that the unit tests' fake
handles need none of it.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from abeja_runtime.frames import Client, Frame

if TYPE_CHECKING:
    from abeja_runtime.front.pending import PendingCall
    from abeja_runtime.front.processes import HandlerProcess, Launcher

__all__ = ["Member", "ProcessState"]


class ProcessState(enum.Enum):
    """Where a handler process is in its life."""

    #: Loading the handler: no call yet.
    STARTING = "starting"
    #: Takes calls.
    READY = "ready"
    #: Takes no more calls; finishes once those it has are answered.
    STOPPING = "stopping"


class Member:
    """One handler process of the pool, and the sink of its handle's frames and of its exit:
    each goes to the pool with this record."""

    __slots__ = (
        "_exited", "_received", "answered", "answered_at", "batches", "launcher", "process",
        "replaces", "request_limit", "retiring", "sent", "started_at", "state",
        "take_back_timer", "writes_streams",
    )  # fmt: skip

    def __init__(
        self,
        received: Callable[[Member, Frame, int | None], None],
        exited: Callable[[Member], None],
    ) -> None:
        self._received = received
        self._exited = exited
        #: Set once its process is started (``Lifecycle.spawn``), and what started it (a reload
        #: tells the old version's processes by it).
        self.process: HandlerProcess
        self.launcher: Launcher
        #: When it was started (``time.monotonic``).
        self.started_at = time.monotonic()
        self.state = ProcessState.STARTING
        #: It writes streamed answers to their clients itself (``Ready.writes_streams``): its
        #: calls go with their client's connection when they have one to lend.
        self.writes_streams = False
        #: Calls sent and not answered, in the order they were sent.
        self.sent: dict[int, PendingCall] = {}
        #: Calls it answered, and when its last answer came (``Scheduler.settle``).
        self.answered = 0
        self.answered_at = 0.0
        #: When to look whether calls wait behind a slow one here (``scheduler.py``).
        self.take_back_timer: asyncio.TimerHandle | None = None
        #: Batches it runs (batch mode: at most ``concurrency``).
        self.batches = 0
        #: The calls it serves before it is retired (``--max-requests``, spread a little).
        self.request_limit: int | None = None
        #: Why it is replaced (``Lifecycle.retire``'s reason) while its replacement starts: it
        #: serves until that one is ready. Empty while it is not being replaced.
        self.retiring = ""
        #: The retiring member it replaces, until it is ready.
        self.replaces: Member | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def send(self, frame: Frame, fd: int | None = None) -> None:
        self.process.send(frame, fd)

    def send_call(self, pending: PendingCall) -> None:
        """Send ``pending``'s frame, after its client's connection when it lends it and this
        process writes its streams itself (``frames.Client``)."""
        client = pending.client
        if client is not None and self.writes_streams and (lent := client.lend()) is not None:
            self.send(Client(pending.frame.id, lent[1]), lent[0])
            pending.lent = True
        self.send(pending.frame, pending.fd)

    def received(self, frame: Frame, fd: int | None) -> None:
        self._received(self, frame, fd)

    def exited(self) -> None:
        self._exited(self)

    def oldest_call_age(self, now: float) -> float:
        """How long ago its oldest call was sent (it holds one)."""
        return now - next(iter(self.sent.values())).sent_at
