"""What the front counts of each call, in one place (:class:`Accounting`): its access record, its
metrics, its span, and the calls in flight that a drain waits for.

Every call, by any way in, opens a :class:`CallEntry` and ends it on every path it can take. Its
status is counted once, before the answer's first byte leaves (a client never holds an answer a
scrape does not count); a call that ends without one, because its client left before it was
answered (or an error escaped), is counted ``499`` (nginx's "client closed request"). A streamed
answer (or a big one written from its file) is counted when it ends, its duration the whole of
it, with the time to its first byte, how it ended (:class:`StreamEnd`) and the bytes sent; one
that did not go out whole with the status of how it ended (``499`` when its client left, ``500``
when the generator raised, ``502`` when its worker died, ``504`` at a stream limit), not the
head's ``200``. Every ``499`` is also counted in ``abandoned_requests_total`` with the stage the
call had reached (``CallEntry.left_at``), so the two always agree.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Final

from abeja_runtime.access_log import AccessLog, StreamedBody
from abeja_runtime.config import Config
from abeja_runtime.frames import Written
from abeja_runtime.metrics import FrontMetrics
from abeja_runtime.stream_limits import CLIENT_CLOSED, StreamEnd
from abeja_runtime.tracing import CallTrace, tracing_from

__all__ = ["Accounting", "CallEntry"]

#: The access records of this many seconds are written at once (not a write per loop
#: iteration); at shutdown too.
_ACCESS_LOG_EVERY: Final = 0.05


class Accounting:
    """The access log, the metrics, and the calls in flight."""

    __slots__ = ("_access_log", "_idle", "in_flight", "metrics", "tracing")

    def __init__(self, config: Config, metrics: FrontMetrics) -> None:
        self._access_log = AccessLog(config.platform.log_fields(), every=_ACCESS_LOG_EVERY)
        self.metrics = metrics
        #: Each call's server span (:mod:`abeja_runtime.tracing`), when OpenTelemetry's
        #: variables ask for traces.
        self.tracing = tracing_from(os.environ, "front")
        #: Calls open (and async requests until their result is sent): the drain waits.
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def open(
        self,
        method: str,
        path: str,
        received: float,
        request_id: str,
        requester_id: str | None = None,
        carrier: Any = None,
        *,
        rpc: bool = False,
    ) -> CallEntry:
        """A call starts: counted in flight until :meth:`CallEntry.end`. With tracing on, its
        server span starts, its parent the caller's context in ``carrier`` (the request's
        headers, or a gRPC call's metadata as a mapping; ``rpc``: ``path`` is its method)."""
        entry = CallEntry(self, method, path, received, request_id, requester_id)
        if self.tracing is not None:
            entry.trace = self.tracing.call(carrier, received, method, path, request_id, rpc=rpc)
        self.hold()  # once nothing can fail before the entry is returned, to be ended
        return entry

    def hold(self) -> None:
        """Something the drain waits for starts (a call, an async request's result)."""
        self.in_flight += 1
        self._idle.clear()

    def release(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    async def idle(self) -> None:
        await self._idle.wait()

    def flush(self) -> None:
        """Write the access records kept so far (before the event loop ends)."""
        self._access_log.flush()

    def close(self) -> None:
        """At the end of serving: the access records kept and the spans buffered go out."""
        self.flush()
        if self.tracing is not None:
            self.tracing.shutdown()

    def record(self, entry: CallEntry, status: int, streamed: StreamedBody | None = None) -> None:
        """``entry``'s access record and metrics, with ``status``."""
        responded = time.time()
        trace = entry.trace
        self._access_log.record(
            entry.method, entry.path, status, entry.received, responded, entry.request_id,
            entry.requester_id, streamed, None if trace is None else trace.ids, entry.noted,
        )  # fmt: skip
        self.metrics.observe(status, responded - entry.received)


class CallEntry:
    """One call's counts: :meth:`count` once with its status, :meth:`end` once when it is over."""

    __slots__ = (
        "_accounting", "_last_chunk", "bytes_sent", "chunks", "first_byte", "left_at", "method",
        "noted", "path", "received", "request_id", "requester_id", "status", "stream_end",
        "trace",
    )  # fmt: skip

    def __init__(
        self,
        accounting: Accounting,
        method: str,
        path: str,
        received: float,
        request_id: str,
        requester_id: str | None,
    ) -> None:
        self._accounting: Accounting | None = accounting
        self.method = method
        self.path = path
        self.received = received
        self.request_id = request_id
        self.requester_id = requester_id
        #: The status counted (0: none yet).
        self.status = 0
        #: When a streamed answer's head left (0: not streamed), how it ended (``None``: not
        #: said, as when its writing was cancelled), and its body's bytes written.
        self.first_byte = 0.0
        self.stream_end: StreamEnd | None = None
        self.bytes_sent = 0
        #: A stream's chunks sent so far (``None``: not a stream), and when the last one went.
        self.chunks: int | None = None
        self._last_chunk = 0.0
        #: The stage the call had reached when its client left (``queued``, ``running``,
        #: ``answering``; ``None``: it did not leave): counted with its ``499``.
        self.left_at: str | None = None
        #: Its spans, when tracing is on.
        self.trace: CallTrace | None = None
        #: What its way in and its admission noted for its access record (:meth:`note`).
        self.noted: dict[str, Any] | None = None

    def note(self, name: str, value: Any) -> None:
        """A field of its access record, and an ``abeja.`` attribute of its server span:
        ``caller`` (with API keys on, its key's short hash, ``api_keys.py``), ``deadline`` (the
        seconds its caller gave it), ``refused`` (why the front answered for it), ``tenant``
        and ``priority`` (``tenants.py``)."""
        if self.noted is None:
            self.noted = {}
        self.noted[name] = value
        if self.trace is not None:
            self.trace.attribute(f"abeja.{name}", value)

    def count(self, status: int) -> None:
        """The call's status, counted now (before its answer leaves); once: a later status is
        not counted again."""
        if self.status:
            return
        self.status = status
        if self.trace is not None:
            self.trace.status(status)
        accounting = self._accounting
        if accounting is not None:
            accounting.record(self, status)

    def streaming(self, status: int, *, chunked: bool) -> None:
        """A streamed answer's head leaves now (``chunked``: a stream of chunks, not a body
        written from its file): it is counted with ``status`` when the stream ends
        (:meth:`end`), with this as its first byte's time."""
        if not self.status:
            self.status = status
            self.first_byte = time.time()
            self.chunks = 0 if chunked else None
            if self.trace is not None:
                self.trace.status(status)

    def chunk_sent(self) -> None:
        """A chunk of the stream goes to its client now: the time to the first chunk (from the
        request's arrival), or since the one before, in the metrics; the first in the span."""
        if self.chunks is None:
            return
        now = time.time()
        accounting = self._accounting
        if not self.chunks:
            seconds = now - self.received
            if accounting is not None:
                accounting.metrics.first_chunk(seconds)
            if self.trace is not None:
                self.trace.first_chunk(seconds)
        elif accounting is not None:
            accounting.metrics.between_chunks(now - self._last_chunk)
        self.chunks += 1
        self._last_chunk = now

    def written(self, report: Written) -> None:
        """What a handler process wrote of the stream to its client itself: its chunks' times
        counted as :meth:`chunk_sent` counts them, and how it ended."""
        if report.chunks:
            self.first_byte = report.first_chunk_at  # the head went with the first chunk
            seconds = report.first_chunk_at - self.received
            accounting = self._accounting
            if accounting is not None:
                accounting.metrics.first_chunk(seconds)
                for gap in report.gaps:
                    accounting.metrics.between_chunks(gap)
            if self.trace is not None:
                self.trace.first_chunk(seconds)
        self.chunks = report.chunks
        self.stream_ended(report.end, report.size)

    def stream_ended(self, end: StreamEnd, bytes_sent: int) -> None:
        """How a streamed answer ended, and the bytes of its body written."""
        self.stream_end = end
        self.bytes_sent = bytes_sent

    def end(self) -> None:
        """The call is over, however it ended: one that was never counted is counted as
        :data:`CLIENT_CLOSED`; a stream, now that it ended, with the status of how it ended.
        Once: a second call does nothing."""
        accounting = self._accounting
        if accounting is None:
            return
        if not self.status:
            accounting.metrics.abandoned(self.left_at or "receiving")
            self.count(CLIENT_CLOSED)
        elif self.first_byte:
            end = self.stream_end or StreamEnd.CLIENT_LEFT  # its writing was cancelled
            status = end.status or self.status
            if end is StreamEnd.CLIENT_LEFT:
                accounting.metrics.abandoned(self.left_at or "answering")
            if self.trace is not None and status != self.status:
                self.trace.status(status)
            streamed = StreamedBody(self.first_byte, end.value, self.bytes_sent, self.chunks)
            accounting.record(self, status, streamed)
        if self.trace is not None:
            self.trace.end()
        self._accounting = None
        accounting.release()
