"""Which running calls the front cancelled (their client left, their deadline passed).

The front sends :class:`~abeja_runtime.frames.Cancel` for a call nobody waits for any more.
A call that has not started is given back instead; for one that runs, whichever thread reads
the frame marks it here, and the call's code looks:

* a streamed answer stops at its next chunk, and its generator is closed (its ``finally``
  runs), instead of running on to its end for nobody;
* a ``def`` handler may watch ``request.cancelled``, a :class:`threading.Event` that is set
  then (made on first use: most handlers never look, and an Event costs more than the rest of
  the bookkeeping of a call).

An ``async def`` handler's task is cancelled by the event loop's reader instead
(``handler_loop.py``).
"""

from __future__ import annotations

import threading

__all__ = ["Cancellations"]


class Cancellations:
    """The calls running in this process, and those of them the front cancelled."""

    __slots__ = ("_cancelled", "_events", "_lock", "_running")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._cancelled: set[int] = set()
        self._events: dict[int, threading.Event] = {}

    def started(self, call_id: int) -> None:
        self._running.add(call_id)

    def finished(self, call_id: int) -> None:
        """The call is over: nothing is kept of it."""
        self._running.discard(call_id)
        if self._cancelled or self._events:
            with self._lock:
                self._cancelled.discard(call_id)
                self._events.pop(call_id, None)

    def cancel(self, call_id: int) -> None:
        """The front cancelled ``call_id`` (ignored unless it runs here now)."""
        with self._lock:
            if call_id not in self._running:
                return
            self._cancelled.add(call_id)
            event = self._events.get(call_id)
        if event is not None:
            event.set()

    def is_cancelled(self, call_id: int) -> bool:
        return call_id in self._cancelled

    def event(self, call_id: int) -> threading.Event:
        """The call's :class:`threading.Event`, set once it is cancelled."""
        with self._lock:
            event = self._events.get(call_id)
            if event is None:
                event = self._events[call_id] = threading.Event()
                if call_id in self._cancelled:
                    event.set()
        return event
