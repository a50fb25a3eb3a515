"""The front's calls, whichever way they came in: admission, places for bodies, deadlines,
cancellation and accounting, each in one place.

Three ways lead into the front: aiohttp's request handling (``server.py``), the direct path
(``direct.py``, ``direct_body.py``) and gRPC (``rpc.py``). Each parses its request, turns it
into a :class:`~abeja_runtime.front.pending.PendingCall`, and writes the answer; everything
between is here, in :class:`CallService`:

* **admission**: :attr:`CallService.admitting` (else ``503 service unavailable``), and the
  pool's queue bound (``503 service busy``);
* **places** for bodies above the inline limit (:mod:`~abeja_runtime.front.body_gate`), and
  the shared buffers they are read into (:class:`Body`);
* **the deadline** of every call (:mod:`~abeja_runtime.front.deadlines`): ``504`` at once,
  the call withdrawn from its handler process;
* **cancellation**: :meth:`CallService.withdraw`, when the client left;
* **accounting**: :attr:`CallService.accounting`, one :class:`~abeja_runtime.front.accounting.
  CallEntry` per call (``499`` for one whose client left), and the refusals' counters;
* **traces**: the call's server span and queue wait (:mod:`~abeja_runtime.tracing`), begun and
  ended with its entry.

Before, these lived in ``HttpServer``, and the direct path and gRPC reached into seventeen of
its members; gRPC calls took no place and were never counted when cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import time
from collections.abc import Callable
from typing import IO, Any, Final

from abeja_runtime.access_log import AccessLog
from abeja_runtime.config import Config
from abeja_runtime.encode import EncodedResponse, status_reply
from abeja_runtime.errors import (
    BodyPastDeadline,
    HandlerTimeout,
    HttpError,
    ServiceBusy,
    ServiceUnavailable,
)
from abeja_runtime.frames import Answer, RpcAnswer
from abeja_runtime.front.accounting import Accounting, CallEntry
from abeja_runtime.front.body_gate import BODIES_AHEAD, BodyGate
from abeja_runtime.front.deadlines import Deadlines
from abeja_runtime.front.pending import PendingCall
from abeja_runtime.front.pool import HandlerPool
from abeja_runtime.front.stream_limits import StreamLimitReached
from abeja_runtime.mapped import BodyBuffers
from abeja_runtime.metrics import FrontMetrics
from abeja_runtime.spool import Scratch
from abeja_runtime.tracing import tracing_from

__all__ = ["Body", "CallService"]

_log = logging.getLogger("abeja_runtime")

#: The access records of this many seconds are written at once: a write per loop iteration
#: cost 2.5 µs per small request (8 % of the front's work). They are written at shutdown too.
_ACCESS_LOG_EVERY: Final = 0.05


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


class CallService:
    """What every call goes through between its request and its answer (see the module)."""

    def __init__(self, config: Config, pool: HandlerPool, metrics: FrontMetrics) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        #: Kept: on Python 3.11 each asyncio.get_running_loop() is a getpid() system call.
        self.loop = asyncio.get_running_loop()
        self._timeout = config.timeout or None
        #: The longest a streamed answer may go without progress, and may last (``None``: no
        #: limit; see :mod:`~abeja_runtime.front.stream_limits`).
        self.stream_idle = config.stream_idle_timeout or None
        self.stream_timeout = config.stream_timeout or None
        self.buffers = BodyBuffers()
        #: The places for bodies above the inline limit.
        self.gate = BodyGate(config.workers * (config.concurrency + BODIES_AHEAD), self.loop)
        self._deadlines = Deadlines(self.loop, self._expire)
        access_log = AccessLog(config.platform.log_fields(), every=_ACCESS_LOG_EVERY)
        #: The calls' spans, when OpenTelemetry's variables ask for traces.
        self.tracing = tracing_from(os.environ, "front")
        #: Every call's counts, and the calls in flight (async ones until their result is
        #: sent), which the drain waits for.
        self.accounting = Accounting(access_log, metrics, self.tracing)
        #: Set at SIGTERM: readiness says 503 and every answer closes its connection; calls are
        #: still taken (balancers send until they see readiness fail), until the service port
        #: stops accepting and gRPC stops (``supervisor.py``).
        self.draining = False

    def close(self) -> None:
        """At the end of serving: the access records kept and the spans buffered go out."""
        self.accounting.flush()
        if self.tracing is not None:
            self.tracing.shutdown()

    # -- admission ---------------------------------------------------------------------------

    @property
    def admitting(self) -> bool:
        """Whether a call can be handed to the pool now (else it is answered 503)."""
        return self._pool.admitting

    @property
    def ready(self) -> bool:
        """Readiness: a handler process is ready, and the front is not draining."""
        return self._pool.serving and not self.draining

    def next_id(self) -> int:
        return self._pool.next_id()

    def refusal(self, exc: HttpError) -> EncodedResponse:
        """The answer to one of the front's refusals, its reason counted."""
        if isinstance(exc, ServiceBusy):
            self._metrics.rejected("busy")
        elif isinstance(exc, ServiceUnavailable):
            self._metrics.rejected("unavailable")
        return status_reply(exc.status, exc.message, exc.headers.items())

    # -- places for bodies -------------------------------------------------------------------

    def may_read_body(self) -> bool:
        """Whether a body above the inline limit may be read now or wait for a place: else the
        queue could not take its call, and it is refused (``503``) before it is read."""
        return self.gate.waiting < self._pool.free_places()

    async def enter_gate(self) -> None:
        """A place for a body above the inline limit, waiting for one if all are held; the
        wait counts as waiting in the queue, and ends at the request's deadline (``504``);
        ``503`` at once when the queue could not take the call."""
        gate = self.gate
        if not self.may_read_body():
            raise ServiceBusy()
        if gate.try_enter():
            return
        try:
            async with asyncio.timeout(self._timeout):
                await gate.enter()
        except TimeoutError:
            raise HandlerTimeout(self._config.timeout) from None

    def held_body(self, size: int) -> tuple[Body, mmap.mmap]:
        """A shared buffer for a body of ``size`` bytes whose place in the gate is held; the
        mapping is the buffer's, to fill, and the body's ``close()`` gives both back."""
        try:
            fd, mapped = self.buffers.take(size)
        except BaseException:  # no memory or descriptor for it: the place is given back
            self.gate.leave()
            raise
        body = Body(None, fd=fd, size=size, buffers=self.buffers)
        body.gate = self.gate
        return body, mapped

    # -- deadlines ---------------------------------------------------------------------------

    def time_left(self, received: float) -> float | None:
        """Seconds to the deadline of a call received at ``received`` (``None``: none)."""
        if self._timeout is None:
            return None
        return max(0.0, received + self._timeout - time.time())

    def at_deadline(
        self, received: float, expired: Callable[..., None], *args: Any
    ) -> asyncio.TimerHandle | None:
        """``expired(*args)`` when the deadline of a call received at ``received`` passes
        (``None``: no deadline)."""
        left = self.time_left(received)
        return None if left is None else self.loop.call_later(left, expired, *args)

    def body_past_deadline(self) -> BodyPastDeadline:
        return BodyPastDeadline(self._config.timeout)

    def _expire(self, pending: PendingCall) -> None:
        if not pending.answer.done():
            pending.answer.set_exception(HandlerTimeout(self._config.timeout))
            self._pool.withdraw(pending)

    # -- the call ----------------------------------------------------------------------------

    def submit(self, pending: PendingCall, received: float) -> set[PendingCall] | None:
        """Hand ``pending`` to the pool, its deadline watched (no task or timeout context per
        call): the calls it is watched with, which it leaves (``discard``) once answered
        (``None``: no deadline). ``ServiceBusy`` when the pool is full."""
        try:
            self._pool.submit(pending)
        except ServiceBusy:
            pending.finish()
            raise
        if self._timeout is None:
            return None
        return self._deadlines.watch(pending, received + self._timeout)

    async def call(
        self, pending: PendingCall, received: float, entry: CallEntry | None
    ) -> Answer | RpcAnswer:
        """The call through the pool, answered within the deadline; withdrawn when the task
        awaiting it is cancelled (its client, whose ``entry`` is told, left)."""
        watched = self.submit(pending, received)
        try:
            return await pending.answer
        except asyncio.CancelledError:  # the client left (perhaps just as its answer came)
            self.abandon(pending, entry)
            raise
        finally:
            if watched is not None:
                watched.discard(pending)

    def stream_cut(self, pending: PendingCall, exc: Exception) -> None:
        """A streamed answer ended before its end (its generator failed, its process died, it
        reached a limit, or its head could not be sent): nobody reads on, and the log says why
        when the front cut it at a limit."""
        self._pool.withdraw(pending)
        if isinstance(exc, StreamLimitReached):
            frame = pending.frame
            _log.warning("%s (request %s)", exc, frame.request_id)

    def abandon(self, pending: PendingCall, entry: CallEntry | None) -> None:
        """The client left before the whole answer: the call is withdrawn (a queued call never
        runs, a running one is cancelled in its handler process: see
        :mod:`~abeja_runtime.worker.cancellation`, a stream stops), and its ``entry`` told the
        stage it reached (``answering``: its answer was being written), for its ``499``.
        Once."""
        if pending.answer_file is not None:
            pending.answer_file.close()
        if pending.abandoned:
            return
        answered = pending.answer.done()
        if entry is not None:
            running = answered or self._pool.running(pending)
            entry.client_left("answering" if answered else "running" if running else "queued")
        if not answered or pending.streaming:
            self._pool.withdraw(pending)
