"""The watch over a request body being read: ended with ``408`` when it stalls, or when it arrives
too slowly to hold one of the front's places for bodies (:meth:`BodyWatch.watch_body`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final, NamedTuple

from aiohttp.web_server import Server

from abeja_runtime.errors import BodyCannotArriveInTime, BodyTimeout, BodyTooSlow, HttpError
from abeja_runtime.front.aiohttp_private import HandlerInternals

__all__ = ["MIN_BODY_RATE", "BodyWatch"]

#: Bytes a second a body must average while it holds one of the front's places for bodies (from
#: the stall timeout after it took the place on): far below any real network.
MIN_BODY_RATE: Final = 1024
#: A body that holds a place is judged by its rate from this many seconds on, at most every as
#: many: one that could not be whole by its deadline at twice its rate is cut then.
_RATE_JUDGED_AFTER: Final = 1.0


class _Watch(NamedTuple):
    """A body being read (see :meth:`BodyWatch.watch_body`); ``began``, ``at_start``: when the
    watch began (loop time), and the bytes received then."""

    arriving: Callable[[], bool]
    stalled: Callable[[BaseException], None]
    received: Callable[[], int] | None
    expected: int | None
    deadline: float | None
    began: float
    at_start: int


class BodyWatch(HandlerInternals):
    """A connection that watches the body being read on it. Its ``data_received`` (and a
    capture's progress) sets ``_last_data``, the loop time bytes last arrived."""

    def __init__(self, manager: Server, *, stall_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._stall_timeout = stall_timeout
        self._last_data = 0.0
        self._body_timer: asyncio.TimerHandle | None = None
        self._watched: _Watch | None = None

    @property
    def fresh(self) -> bool:
        """Accepted, and not a byte received yet: a request is on its way."""
        return self._last_data == 0.0

    def body_progress(self) -> None:
        """Bytes of a body read past the parser arrived."""
        self._last_data = self.event_loop.time()

    def watch_body(
        self,
        arriving: Callable[[], bool],
        stalled: Callable[[BaseException], None],
        received: Callable[[], int] | None = None,
        expected: int | None = None,
        time_left: float | None = None,
    ) -> None:
        """Call ``stalled`` with :class:`~abeja_runtime.errors.BodyTimeout` if no byte of the
        body arrives for the stall timeout while it is ``arriving()``; and, for a body that
        holds a place (``received()``: its bytes so far), from :data:`_RATE_JUDGED_AFTER`
        seconds on, with :class:`~abeja_runtime.errors.BodyCannotArriveInTime` when its
        ``expected`` length could not be whole within ``time_left`` (its deadline) even at
        twice its average rate, and with :class:`~abeja_runtime.errors.BodyTooSlow` when, the
        stall timeout or more after the watch began, it has arrived slower than
        :data:`MIN_BODY_RATE` on average. One timer per connection, not reset for every packet:
        it looks at when bytes last came, and at the body watched now."""
        now = self.event_loop.time()
        self._last_data = now
        deadline = None if time_left is None else now + time_left
        at_start = received() if received else 0
        self._watched = _Watch(arriving, stalled, received, expected, deadline, now, at_start)
        if self._body_timer is None:
            first = self._stall_timeout
            if received is not None and expected is not None and deadline is not None:
                first = min(first, _RATE_JUDGED_AFTER)
            self._body_timer = self.event_loop.call_later(first, self._check_body)

    def _check_body(self) -> None:
        self._body_timer = None
        watched = self._watched
        if watched is None:
            return
        if not watched.arriving():
            self._watched = None
            return
        now = self.event_loop.time()
        idle = now - self._last_data
        stall_timeout = self._stall_timeout
        late = (
            BodyTimeout(stall_timeout)
            if idle >= stall_timeout
            else _too_slow(watched, now, stall_timeout)
        )
        if late is not None:
            self._watched = None
            watched.stalled(late)
            return
        next_look = max(0.0, stall_timeout - (now - watched.began)) or 1.0
        if watched.expected is not None and watched.deadline is not None:
            next_look = _RATE_JUDGED_AFTER
        self._body_timer = self.event_loop.call_later(
            min(stall_timeout - idle, next_look), self._check_body
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._watched = None
        super().connection_lost(exc)


def _too_slow(watched: _Watch, now: float, stall_timeout: float) -> HttpError | None:
    """Why a body that holds a place is to be cut for its rate now (``None``: it is not)."""
    received = watched.received
    watched_for = now - watched.began
    if received is None or watched_for < _RATE_JUDGED_AFTER:
        return None
    got = received()
    rate = (got - watched.at_start) / watched_for
    if watched.expected is not None and watched.deadline is not None and rate > 0:
        remaining = watched.expected - got
        left = watched.deadline - now
        if left > _RATE_JUDGED_AFTER and remaining > 2 * rate * left:  # (else: the deadline)
            return BodyCannotArriveInTime(rate, remaining, left)
    if watched_for >= stall_timeout and rate < MIN_BODY_RATE:
        return BodyTooSlow(rate, MIN_BODY_RATE)
    return None
