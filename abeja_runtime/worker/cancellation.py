"""Which running calls the front cancelled (their client left, their deadline passed).

Whichever thread reads a :class:`~abeja_runtime.frames.Cancel` marks its call here, and the
call's code looks: a streamed answer stops at its next chunk; a ``def`` handler may watch
``request.cancelled`` (an event made on first use: most handlers never look); with
``--cancel-raises`` a ``def`` handler is interrupted, :class:`~abeja_runtime.errors.
CallCancelled` raised in its thread as Cog does (on the main thread by a signal, which also ends
a ``time.sleep`` or a blocking read; on a handler thread at its next bytecode).
"""

from __future__ import annotations

import ctypes
import signal
import threading

from abeja_runtime.errors import CallCancelled

__all__ = ["Cancellations"]

#: The signal that interrupts a handler on the main thread (nothing else of the worker uses it).
_INTERRUPT = signal.SIGUSR1


class Cancellations:
    """The calls running in this process, and those of them the front cancelled."""

    __slots__ = ("_cancelled", "_events", "_interruptible", "_lock", "_main", "_running")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self._cancelled: set[int] = set()
        self._events: dict[int, threading.Event] = {}
        #: Calls whose handler may be interrupted now, and the thread each runs on.
        self._interruptible: dict[int, int] = {}
        self._main = threading.main_thread().ident

    def raise_in_handlers(self) -> None:
        """From now on :meth:`interruptible` calls are interrupted when cancelled (called on
        the main thread, once: it installs the signal's handler)."""
        signal.signal(_INTERRUPT, self._interrupted)

    def interruptible(self, call_id: int) -> None:
        """The handler of ``call_id`` runs from now on, on this thread, and may be interrupted
        (until :meth:`uninterruptible`); at once if it was cancelled already."""
        with self._lock:
            self._interruptible[call_id] = threading.get_ident()
            if call_id in self._cancelled:
                self._interrupt(call_id)

    def uninterruptible(self, call_id: int) -> None:
        """The handler returned: no interruption from now on, and none still on its way to
        this thread (a handler thread takes its next call next)."""
        with self._lock:
            thread = self._interruptible.pop(call_id, None)
            if thread is not None and thread != self._main:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)

    def started(self, call_id: int) -> None:
        self._running.add(call_id)

    def finished(self, call_id: int) -> None:
        self._running.discard(call_id)
        if self._cancelled or self._events or self._interruptible:
            with self._lock:
                self._cancelled.discard(call_id)
                self._events.pop(call_id, None)
                self._interruptible.pop(call_id, None)

    def cancel(self, call_id: int) -> None:
        """The front cancelled ``call_id`` (ignored unless it runs here now)."""
        with self._lock:
            if call_id not in self._running or call_id in self._cancelled:
                return  # not here, or cancelled already (a second Cancel changes nothing)
            self._cancelled.add(call_id)
            event = self._events.get(call_id)
            # In the same hold of the lock as the mark: interruptible() sees either neither
            # or both, so one of the two interrupts, never both.
            self._interrupt(call_id)
        if event is not None:
            event.set()

    def _interrupt(self, call_id: int) -> None:
        """Raise in the thread of ``call_id`` if it is interruptible (the lock held: the call
        cannot leave its handler meanwhile, see :meth:`uninterruptible`)."""
        thread = self._interruptible.get(call_id)
        if thread is None:
            return
        if thread == self._main:
            signal.pthread_kill(thread, _INTERRUPT)
        else:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread), ctypes.py_object(CallCancelled)
            )

    def _interrupted(self, signum: int, frame: object) -> None:
        """The signal's handler, on the main thread: raise only in a cancelled handler (a
        signal that came as it returned does nothing)."""
        for call_id, thread in list(self._interruptible.items()):
            if thread == self._main and call_id in self._cancelled:
                raise CallCancelled()

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
