"""The pool's records: of a call (:class:`PendingCall`, its ticket: the frame sent, the answer's
future, the chunks of a streamed answer, where it is), made when the call is submitted
(``call.py``) and moved by the scheduler; and of a handler process (:class:`Member`: its state
and the calls it was sent), kept off the process's handle (``processes.py``) so that the unit
tests' fake handles need none of it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from abeja_runtime.frames import (
    CREDIT_STEP,
    CREDIT_STEP_BYTES,
    Answer,
    Call,
    Client,
    Credit,
    Frame,
    RpcAnswer,
    RpcCall,
    Written,
)
from abeja_runtime.front.answer_file import AnswerFile
from abeja_runtime.front.tenants import NORMAL

if TYPE_CHECKING:
    from abeja_runtime.front.processes import HandlerProcess, Launcher
    from abeja_runtime.tracing import CallTrace

__all__ = [
    "STREAM_FAILED", "STREAM_LOST", "Batch", "ClientLender", "Member", "PendingCall",
    "ProcessState", "StreamFailed",
]  # fmt: skip

#: Put in a streamed answer's chunks where it was cut short: its generator raised, or its
#: process exited.
STREAM_FAILED: Final = object()
STREAM_LOST: Final = object()


class StreamFailed(RuntimeError):
    """A streamed answer cut short by its handler process: its generator raised, or (``lost``)
    the process exited."""

    def __init__(self, *, lost: bool) -> None:
        super().__init__(
            "the handler's worker exited during the streamed answer"
            if lost
            else "the handler's streamed content failed"
        )
        self.lost = lost


class ClientLender(Protocol):
    """A call's client connection, as its process may borrow it to write a streamed answer
    itself (``worker/client_streams.py``)."""

    def lend(self) -> tuple[int, bool] | None:
        """The connection's descriptor and whether the answer ends the connection, as it is
        lent now; ``None`` when it cannot be (closed, or bytes still wait in its buffer)."""


@dataclasses.dataclass(slots=True)
class Batch:
    """The calls of a batch (``--max-batch-size``) not answered yet: its process's slot is
    free once none is left."""

    left: int


class PendingCall:
    """One call on its way: the frame to send, its answer when it comes, its streamed chunks."""

    __slots__ = (
        "_cleanup", "abandoned", "answer", "answer_file", "batch", "caller_budget", "chunks",
        "client", "deadline", "fd", "frame", "giving_back", "lent", "member", "on_end",
        "on_returned", "priority", "queued_at", "report", "sent_at", "streaming", "tenant", "trace",
        "turn", "waited", "withdrawn_at", "written",
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
        self.trace = trace  # its spans in the front, when tracing is on
        self.fd = fd  # sent with the frame (the spool file)
        self._cleanup = cleanup  # once the call is over: the spool file goes
        # The loop is passed, not looked up: on Python 3.11 each lookup is a getpid() call.
        self.answer: asyncio.Future[Answer | RpcAnswer] = loop.create_future()
        self.chunks: asyncio.Queue[Any] | None = None
        #: Called with a written stream's end (``None``, :data:`STREAM_FAILED` or
        #: :data:`STREAM_LOST`) as it comes, in place of the chunks' queue (:meth:`end_stream`).
        self.on_end: Callable[[object], None] | None = None
        #: The body of an answer that came without one; whoever writes it closes it.
        self.answer_file: AnswerFile | None = None
        self.abandoned = False
        self.withdrawn_at = 0.0  # (:meth:`abandon`, ``time.monotonic()``)
        #: The head of its streamed answer came: its generator runs.
        self.streaming = False
        #: The handler process it was sent to (``None``: in the queue).
        self.member: Member | None = None
        self.sent_at = 0.0
        #: Its process was asked to give it back (it waits there behind a slow call).
        self.giving_back = False
        #: When it was queued; whether its wait is counted (its handler call began, or it was
        #: given up); in batch mode the batch it was sent in.
        self.queued_at = 0.0
        self.waited = False
        self.batch: Batch | None = None
        #: When it must be answered by (``time.time()``): it is never sent after that.
        #: ``caller_budget``: the seconds its caller gave, when that set the deadline.
        self.deadline = math.inf
        self.caller_budget = 0.0
        #: Whose it is, its priority class (0 the highest) and its start tag, with tenants or
        #: priorities on (``waiting.py``).
        self.tenant = ""
        self.priority = NORMAL
        self.turn = 0.0
        #: Its client's connection, to lend to a process that writes streams itself; ``lent``
        #: while one holds it (the front writes nothing on it then), and what runs once it is
        #: given back (:meth:`returned`). ``written``: the process wrote the answer itself, and
        #: ``report`` says what (with its ``End``).
        self.client: ClientLender | None = None
        self.lent = False
        self.on_returned: Callable[[], None] | None = None
        self.written = False
        self.report: Written | None = None

    async def stream(self) -> AsyncIterator[bytes]:
        """The streamed body's pieces as they come; :class:`StreamFailed` where it was cut short.
        The chunks taken give their credit back (:class:`~abeja_runtime.frames.Credit`): a slow
        client holds up its own stream only."""
        chunks = self.chunks
        assert chunks is not None
        taken = taken_bytes = 0
        while True:
            item = await chunks.get()
            if item is None:
                return
            if item is STREAM_FAILED or item is STREAM_LOST:
                raise StreamFailed(lost=item is STREAM_LOST)
            if isinstance(item, AnswerFile):
                try:
                    for piece in item.pieces():
                        yield piece
                finally:
                    item.close()
                taken_bytes += item.size
            else:
                yield item
                taken_bytes += len(item)
            taken += 1
            if taken >= CREDIT_STEP or taken_bytes >= CREDIT_STEP_BYTES:
                if self.member is not None:
                    self.member.send(Credit(self.frame.id, taken, taken_bytes))
                taken = taken_bytes = 0

    def end_stream(self, end: object) -> None:
        """Its streamed answer ended (``None``: whole; else :data:`STREAM_FAILED` or
        :data:`STREAM_LOST`): told to whoever waits for the end of a stream its process wrote,
        else queued after its chunks."""
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end(end)
        elif self.chunks is not None:
            self.chunks.put_nowait(end)

    def when_ended(self, on_end: Callable[[object], None]) -> None:
        """``on_end`` called with the end of the stream its process writes itself, now if it
        came already."""
        chunks = self.chunks
        if chunks is not None and not chunks.empty():
            on_end(chunks.get_nowait())
        else:
            self.on_end = on_end

    def returned(self, *, to_queue: bool = False) -> None:
        """Its process is done with it (``to_queue``: it goes back to the queue): the connection
        lent with it is the front's again."""
        if to_queue:
            self.member = None
        if self.lent:
            self.lent = False
            on_returned, self.on_returned = self.on_returned, None
            if on_returned is not None:  # once the pool is done with the frame that said so
                self.answer.get_loop().call_soon(on_returned)

    def finish(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def abandon(self) -> None:
        """Nobody waits for the answer any more (timeout, client gone): it is dropped when it
        comes, and so are the chunks of its stream held now."""
        self.abandoned = True
        self.withdrawn_at = time.monotonic()
        self.answer.add_done_callback(_retrieve)
        chunks, self.chunks = self.chunks, None
        while chunks is not None and not chunks.empty():
            item = chunks.get_nowait()
            if isinstance(item, AnswerFile):
                item.close()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """An answer nobody awaits any more (a crash after the client left) is no "never
    retrieved"."""
    if not future.cancelled():
        future.exception()


class ProcessState(enum.Enum):
    """Where a handler process is in its life."""

    STARTING = "starting"  # loading the handler: no call yet
    READY = "ready"  # takes calls
    STOPPING = "stopping"  # takes no more; finishes once those it has are answered


class Member:
    """One handler process of the pool, and the sink of its frames and of its exit."""

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
        #: Set once its process is started, and what started it (a reload tells the old
        #: version's processes by it).
        self.process: HandlerProcess
        self.launcher: Launcher
        self.started_at = time.monotonic()
        self.state = ProcessState.STARTING
        #: It writes streamed answers to their clients itself (``Ready.writes_streams``).
        self.writes_streams = False
        #: Calls sent and not answered, in the order they were sent.
        self.sent: dict[int, PendingCall] = {}
        #: Calls it answered, and when its last answer came.
        self.answered = 0
        self.answered_at = 0.0
        #: When to look whether calls wait behind a slow one here.
        self.take_back_timer: asyncio.TimerHandle | None = None
        self.batches = 0  # (batch mode) at most ``concurrency``
        #: The calls it serves before it is retired (``--max-requests``, spread a little).
        self.request_limit: int | None = None
        #: Why it is replaced while its replacement starts (it serves until that one is
        #: ready); empty while it is not being replaced.
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
