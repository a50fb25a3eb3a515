"""The limits of an answer while its body is written a piece at a time (:class:`StreamLimits`),
and how such an answer ended (:class:`StreamEnd`), in the front or in the handler process that
writes it (``worker/client_streams.py``).

A streamed answer, or a big one written from its file, is cut short (its connection closed,
its generator closed) when it makes no progress for ``--stream-idle-timeout`` seconds: no chunk
came from its handler *and* its client took nothing, as Envoy's ``stream_idle_timeout`` counts
both ways (nginx's ``send_timeout`` and Go's ``WriteTimeout`` bound the client's side). A
client that reads nothing would otherwise hold its stream's handler slot for as long as the
generator waits for credit. With ``--stream-timeout``, a stream is also cut once it has lasted
that long in all, whatever it sends: that ends this stream alone. Neither limit ever judges the
handler process: its other calls go on.

One timer per stream, moved lazily: progress only notes the loop's time (a chunk costs no
timer), and the timer, when it fires, looks whether there was progress since and sets itself
again for the new deadline. At a limit it cancels the writing task, and the ``with`` turns that
cancellation into :class:`StreamIdle` or :class:`StreamTooLong`.
"""

from __future__ import annotations

import asyncio
import enum
import math
from types import TracebackType
from typing import Final

__all__ = [
    "CLIENT_CLOSED", "StreamEnd", "StreamIdle", "StreamLimitReached", "StreamLimits",
    "StreamTooLong",
]  # fmt: skip

#: The status a call whose client left before its answer is counted with.
CLIENT_CLOSED: Final = 499


class StreamEnd(enum.Enum):
    """How an answer written at its client's pace ended (its access record's ``stream_end``)."""

    COMPLETE = "complete"
    CLIENT_LEFT = "client_left"
    #: The handler's generator raised.
    FAILED = "failed"
    #: The handler's worker exited while it ran.
    WORKER_LOST = "worker_lost"
    #: Cut at ``--stream-idle-timeout``, or at ``--stream-timeout``.
    IDLE = "idle"
    TOO_LONG = "too_long"

    @property
    def status(self) -> int | None:
        """The status it is counted with (``None``: the head's)."""
        return _STREAM_END_STATUS.get(self)


_STREAM_END_STATUS: Final = {
    StreamEnd.CLIENT_LEFT: CLIENT_CLOSED,
    StreamEnd.FAILED: 500,
    StreamEnd.WORKER_LOST: 502,
    StreamEnd.IDLE: 504,
    StreamEnd.TOO_LONG: 504,
}


class StreamLimitReached(RuntimeError):
    """A body being written reached one of its limits and was cut short."""


class StreamIdle(StreamLimitReached):
    """No chunk came and the client took nothing for ``--stream-idle-timeout`` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the streamed answer made no progress for {seconds:g} s (its handler sent nothing "
            "and its client took nothing) and was cut short; the limit is "
            "ABEJA_RUNTIME_STREAM_IDLE_TIMEOUT (--stream-idle-timeout)"
        )


class StreamTooLong(StreamLimitReached):
    """The stream lasted ``--stream-timeout`` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the streamed answer lasted {seconds:g} s and was cut short; the limit is "
            "ABEJA_RUNTIME_STREAM_TIMEOUT (--stream-timeout)"
        )


class StreamLimits:
    """``with StreamLimits(...) as limits:`` around the writing of one body; call
    :meth:`progress` whenever a chunk came or the client took one. Seconds of ``None`` (or 0):
    no such limit."""

    __slots__ = ("_end", "_idle", "_last", "_loop", "_reached", "_task", "_timer", "_whole")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, idle: float | None, whole: float | None = None
    ) -> None:
        self._loop = loop
        self._idle = idle or math.inf
        self._whole = whole or math.inf
        self._end = math.inf
        self._last = 0.0
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reached: StreamLimitReached | None = None

    def __enter__(self) -> StreamLimits:
        self._task = asyncio.current_task(self._loop)
        self._last = now = self._loop.time()
        self._end = now + self._whole
        self._arm()
        return self

    def progress(self) -> None:
        """A chunk came, or the client took one: the idle limit counts from now."""
        self._last = self._loop.time()

    def _arm(self) -> None:
        deadline = min(self._last + self._idle, self._end)
        if deadline != math.inf:
            self._timer = self._loop.call_at(deadline, self._look)

    def _look(self) -> None:
        """The timer: a limit reached cancels the writing task, else the timer moves on."""
        self._timer = None
        now = self._loop.time()
        if now >= self._end:
            self._reached = StreamTooLong(self._whole)
        elif now >= self._last + self._idle:
            self._reached = StreamIdle(self._idle)
        else:
            self._arm()
            return
        assert self._task is not None
        self._task.cancel()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        reached = self._reached
        if reached is not None and isinstance(exc, asyncio.CancelledError):
            assert self._task is not None
            self._task.uncancel()  # the cancellation was this limit's, not the client's
            raise reached from None
