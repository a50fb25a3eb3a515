"""One call's life in the front, from its parsed request to its outcome (:class:`FrontCall`).

Every way in (the direct path, aiohttp's request handling, gRPC, an async request's job) begins
a call from its request's head (:meth:`~abeja_runtime.front.service.CallService.begin`) with the
:class:`Responder` that writes its answers, reads the body, and submits the call. The call does
the rest, the same on every way in: its :class:`Stage`, its ticket in the pool
(:class:`~abeja_runtime.front.pending.PendingCall`), its deadline, the answer or the front's
refusal handed to the responder, its client's leaving, and the one :meth:`FrontCall.finish`
that every way out goes through, which keeps its :class:`Outcome`. It is callback-first: the
direct path writes a whole answer from the answer's callback, with no task or coroutine; the
coroutine ways in await their responder.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from abeja_runtime.errors import (
    DeadlineTooNear,
    HandlerTimeout,
    HttpError,
    NotStartedInTime,
    ServiceBusy,
    ServiceUnavailable,
)
from abeja_runtime.frames import Answer, Call, RpcAnswer, RpcCall
from abeja_runtime.front.pending import ClientLender, PendingCall
from abeja_runtime.front.tenants import NORMAL, PRIORITIES
from abeja_runtime.stream_limits import StreamLimitReached
from abeja_runtime.tracing import carrier

if TYPE_CHECKING:
    from yarl import URL

    from abeja_runtime.front.accounting import CallEntry
    from abeja_runtime.front.body import Body
    from abeja_runtime.front.deadlines import Deadlines
    from abeja_runtime.front.pool import HandlerPool
    from abeja_runtime.front.tenants import Tenants
    from abeja_runtime.metrics import FrontMetrics

__all__ = ["AwaitedAnswer", "CallServices", "FrontCall", "Outcome", "Responder", "Stage"]

_log = logging.getLogger("abeja_runtime")


class Stage(enum.Enum):
    """Where a call is in its life."""

    #: Its request is parsed, its body being read.
    RECEIVED = "receiving"
    #: In the pool's queue (or waiting in a handler process behind another call).
    QUEUED = "queued"
    #: Its handler runs.
    RUNNING = "running"
    #: Its answer (or the front's refusal) is being written.
    ANSWERING = "answering"
    DONE = "done"


class Outcome(enum.Enum):
    """How a call ended."""

    ANSWERED = "answered"
    #: The front answered for it: the queue was full, no process was ready, its body was
    #: refused, or its process died under it.
    REFUSED = "refused"
    TIMED_OUT = "timed_out"
    CLIENT_LEFT = "client_left"
    #: Its streamed answer was cut short after its head (its generator failed, its process
    #: died, a stream limit).
    CUT = "cut"


class Responder(Protocol):
    """How one way in writes a call's answers. Each method is called once at most, from the
    loop, and the writing ends with the call's :meth:`FrontCall.finish`."""

    def answer(self, call: FrontCall, answer: Answer | RpcAnswer) -> None:
        """Write the handler's answer: whole, or (its body ``None``) streamed or from its
        file (the ticket's ``answer_file``)."""

    def refuse(self, call: FrontCall, exc: HttpError) -> None:
        """Write the front's own answer for the call (counted by the call already)."""


class CallServices(Protocol):
    """What calls share: the call service (``service.py``), as a call and its writers see it."""

    pool: HandlerPool
    metrics: FrontMetrics
    deadlines: Deadlines
    tenants: Tenants | None
    loop: asyncio.AbstractEventLoop
    #: Seconds from a call's request to its deadline, and the streams' limits (``None``: none).
    timeout: float | None
    stream_idle: float | None
    stream_timeout: float | None
    #: The front drains: every answer ends its connection.
    draining: bool

    def caller(self, headers: Mapping[str, str]) -> str | None:
        """Its API key's short hash (``None``: keys are off), or ``Unauthorized``."""


class FrontCall:
    """One call's life (see the module). Made by the call service's ``begin``."""

    __slots__ = (
        "_stage", "_watched", "body", "caller_budget", "deadline", "entry", "id", "outcome",
        "priority", "responder", "service", "tenant", "ticket",
    )  # fmt: skip

    def __init__(self, service: CallServices, entry: CallEntry, responder: Responder) -> None:
        self.service = service
        #: Its counts: its status, its access record, its span.
        self.entry = entry
        #: Writes its answers; let go once it finishes (they hold each other: see finish).
        self.responder = responder
        self.id = service.pool.next_id()
        self._stage = Stage.RECEIVED
        self.outcome: Outcome | None = None
        #: What the pool holds of it, once submitted.
        self.ticket: PendingCall | None = None
        self.body: Body | None = None
        #: The deadline slot it is watched in (``None``: no deadline, or it left it).
        self._watched: set[PendingCall] | None = None
        #: When it must be answered by (``time.time()``; ``None``: never), and the seconds its
        #: caller gave when that is what set it (0: ``--timeout`` did): the call service's.
        self.deadline: float | None = None
        self.caller_budget = 0.0
        #: Whose it is and its priority class, with tenants or priorities on (``tenants.py``;
        #: the tenant of ``--tenant-header api-key`` is known once its key was checked).
        self.tenant = ""
        self.priority = NORMAL

    @property
    def stage(self) -> Stage:
        """Where the call is now (running once the pool sent it to a handler process)."""
        ticket = self.ticket
        if self._stage is Stage.QUEUED and ticket is not None and ticket.member is not None:
            return Stage.RUNNING
        return self._stage

    # -- the way in ---------------------------------------------------------------------------

    def admit(self, headers: Mapping[str, str]) -> None:
        """Its caller checked and noted, with API keys on (else ``401``: ``Unauthorized``), and
        ``503`` (``ServiceUnavailable``) while no handler process takes calls."""
        if (caller := self.service.caller(headers)) is not None:
            self.entry.note("caller", caller)
        if not self.service.pool.admitting:
            raise ServiceUnavailable()

    def frame(
        self,
        method: str,
        url: URL,
        raw_headers: tuple[tuple[bytes, bytes], ...],
        data: bytes | None,
        size: int,
        spool_path: str = "",
    ) -> Call:
        """The call frame of an HTTP request to ``url``: its body in the frame (``data``), or
        ``size`` bytes sent beside it (a shared buffer, or the spool file at ``spool_path``)."""
        entry = self.entry
        return Call(
            self.id, method, url.raw_path, url.raw_query_string, raw_headers, entry.request_id,
            entry.requester_id, data, spool_path, size, carrier(entry.trace), self.start_by(),
        )  # fmt: skip

    def start_by(self) -> float:
        """The latest its handler may start (``time.time()``; 0: any time): with its caller's
        own deadline, that less the time a call takes, so that no call starts that could not
        answer before its caller gives up; else its deadline (``--timeout``'s)."""
        deadline = self.deadline
        if deadline is None:
            return 0.0
        return self.service.pool.scheduler.start_by(deadline) if self.caller_budget else deadline

    def submit(self, frame: Call | RpcCall, body: Body, client: ClientLender | None = None) -> None:
        """Hand the call to the pool, its deadline watched (with its ``client``'s connection to
        lend, on the direct path); the answer (or the front's refusal) goes to the responder
        from the answer's callback."""
        service = self.service
        self.body = body
        ticket = PendingCall(frame, service.loop, body.fd, body.close, self.entry.trace)
        ticket.client = client
        self.ticket = ticket
        self._stage = Stage.QUEUED
        deadline = self.deadline
        if deadline is not None:
            ticket.deadline, ticket.caller_budget = deadline, self.caller_budget
        tenants = service.tenants
        if tenants is not None:
            noted = self.entry.noted or {}
            ticket.tenant = self.tenant or tenants.tenant({}, noted.get("caller"))
            ticket.priority = self.priority
            self.entry.note("tenant", ticket.tenant)
            self.entry.note("priority", PRIORITIES[self.priority])
        try:
            if self.caller_budget:  # the caller's own deadline: refused if too near
                service.pool.admit_before(
                    ticket.deadline, self.caller_budget, ticket.tenant, ticket.priority
                )
            service.pool.submit(ticket)
        except (ServiceBusy, HandlerTimeout) as exc:
            ticket.finish()
            self.refuse(exc)
            return
        if deadline is not None:
            self._watched = service.deadlines.watch(ticket, deadline)
        ticket.answer.add_done_callback(self._answered)

    def _answered(self, future: asyncio.Future[Answer | RpcAnswer]) -> None:
        if self._stage is Stage.DONE:  # its client left
            return
        self._leave_deadline()
        exc = future.exception()
        if exc is not None:  # the front's own: 504 (deadline) or 502 (the process died)
            assert isinstance(exc, HttpError), exc
            self.refuse(exc)
            return
        self._stage = Stage.ANSWERING
        self.responder.answer(self, future.result())

    def refuse(self, exc: HttpError) -> None:
        """The front answers for the call with ``exc`` (its reason counted), through the
        responder; not once it is over (its client left meanwhile: it was counted then)."""
        if self._stage is Stage.DONE:
            return
        if isinstance(exc, HandlerTimeout):
            self.outcome = Outcome.TIMED_OUT
        elif exc.status == 502:
            self.outcome = Outcome.CUT
        else:
            self.outcome = Outcome.REFUSED
        metrics = self.service.metrics
        if isinstance(exc, (DeadlineTooNear, NotStartedInTime)):
            metrics.rejected("deadline")
            self.entry.note("refused", "deadline")
        elif isinstance(exc, ServiceBusy):
            metrics.rejected("busy")
        elif isinstance(exc, ServiceUnavailable):
            metrics.rejected("unavailable")
        self._stage = Stage.ANSWERING
        self.responder.refuse(self, exc)

    # -- the way out --------------------------------------------------------------------------

    def client_left(self) -> None:
        """The client left before the whole answer: the call is withdrawn (a queued call never
        runs, a running one is cancelled in its handler process, a stream stops), and its
        entry told the stage it reached, for its ``499``; then it finishes."""
        if self._stage is Stage.DONE:
            return
        ticket = self.ticket
        if ticket is not None and not ticket.abandoned:
            answered = ticket.answer.done()
            running = answered or self.service.pool.running(ticket)
            self.entry.left_at = "answering" if answered else "running" if running else "queued"
            if not answered or ticket.streaming:
                self.service.pool.withdraw(ticket)
        self.finish(Outcome.CLIENT_LEFT)

    def cut(self, exc: Exception) -> None:
        """Its streamed answer ended before its end (its generator failed, its process died, it
        reached a limit, or its head could not be sent): nobody reads on, and the log says why
        when the front cut it at a limit."""
        self.outcome = Outcome.CUT
        if self.ticket is not None:
            self.service.pool.withdraw(self.ticket)
        if isinstance(exc, StreamLimitReached):
            _log.warning("%s (request %s)", exc, self.entry.request_id)

    def finish(self, outcome: Outcome = Outcome.ANSWERED) -> None:
        """The call is over (``outcome``, unless one was said before): its entry and span end,
        it leaves its deadline's set, and what it holds is closed; a body the pool never took
        is given back here (else the pool gives it back once its process is done with it).
        Once: a second call does nothing."""
        if self._stage is Stage.DONE:
            return
        self._stage = Stage.DONE
        if self.outcome is None:
            self.outcome = outcome
        self._leave_deadline()
        ticket = self.ticket
        tenants = self.service.tenants
        if tenants is not None and ticket is not None and ticket.tenant:
            served = self.outcome is Outcome.ANSWERED
            self.service.metrics.tenant_call(tenants.label(ticket.tenant), served)
        if ticket is None:
            if self.body is not None:
                self.body.close()
        else:
            if ticket.answer_file is not None:
                ticket.answer_file.close()
            ticket.client = None
        self.entry.end()
        # Its responder and it hold each other (as the ticket held the responder, to lend its
        # connection): let go, so that a call's objects are freed as it ends, not by the collector.
        del self.responder

    def _leave_deadline(self) -> None:
        watched, self._watched = self._watched, None
        if watched is not None and self.ticket is not None:
            watched.discard(self.ticket)


class AwaitedAnswer:
    """The :class:`Responder` of a coroutine way in: the answer, or the front's refusal, kept
    in :attr:`result` for the coroutine that awaits it and writes it."""

    __slots__ = ("result",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.result: asyncio.Future[Answer | RpcAnswer | HttpError] = loop.create_future()

    def answer(self, call: FrontCall, answer: Answer | RpcAnswer) -> None:
        self.result.set_result(answer)

    def refuse(self, call: FrontCall, exc: HttpError) -> None:
        self.result.set_result(exc)
