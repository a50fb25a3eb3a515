"""The body of a request on the direct path above the inline limit, with a ``Content-Length``, up
to the spool threshold (:class:`DirectBody`).

It takes a place in the front's :class:`~abeja_runtime.front.body.BodyGate` (waiting in line,
unread in its connection, until its call's deadline at most: then ``504``), then a shared buffer,
into which the connection reads it straight from the socket (``capture.py``); then the call is
submitted. A body that stops arriving, or is still arriving at its call's deadline, fails with
``408``. Each failure closes the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp.streams import StreamReader

from abeja_runtime.errors import HttpError, ServiceUnavailable
from abeja_runtime.front.capture import BodyCapture
from abeja_runtime.front.connection import Connection

if TYPE_CHECKING:
    from abeja_runtime.front.body import Body
    from abeja_runtime.front.call import FrontCall
    from abeja_runtime.front.service import CallService

__all__ = ["DirectBody"]


class DirectBody:
    """Reads one request's body for the direct path; ``ready(body)`` once it is whole in its
    buffer (the call then owns it), or ``failed(error)`` (the request is then answered with
    ``error``)."""

    __slots__ = (
        "_body",
        "_call",
        "_capture",
        "_connection",
        "_failed",
        "_payload",
        "_ready",
        "_service",
        "_size",
        "_timer",
        "_turn",
    )

    def __init__(
        self,
        service: CallService,
        connection: Connection,
        payload: StreamReader,
        size: int,
        call: FrontCall,
        ready: Callable[[Body], None],
        failed: Callable[[HttpError], None],
    ) -> None:
        self._service = service
        self._connection = connection
        self._payload = payload
        self._size = size
        #: Whose body it is: its deadline is the call's.
        self._call = call
        self._ready = ready
        self._failed = failed
        self._turn: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._capture: BodyCapture | None = None
        self._body: Body | None = None

    def start(self) -> None:
        """Take a place now, or wait in line for one, the body left in the connection."""
        gate = self._service.bodies.gate
        if gate.try_enter():
            self._read()
            return
        self._turn = gate.wait()
        self._turn.add_done_callback(self._placed)
        self._connection.hold_body(self._payload)
        left = self._service.bodies.time_left(self._call.deadline)
        if left is not None:
            self._timer = self._service.loop.call_later(left, self._not_placed_in_time)

    def _placed(self, turn: asyncio.Future[None]) -> None:
        if turn is not self._turn or turn.cancelled():  # given up meanwhile
            return
        self._turn = None
        self._stop_timer()
        self._read()

    def _not_placed_in_time(self) -> None:
        """Its call's deadline passed while it waited for a place: ``504``, nothing held (the
        connection closes, the body unread)."""
        self._timer = None
        turn, self._turn = self._turn, None
        assert turn is not None
        bodies = self._service.bodies
        bodies.gate.give_up(turn)
        self._failed(bodies.not_placed_in_time(self._call.caller_budget))

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _read(self) -> None:
        """The place is held: into a buffer, from what the parser has of the body on."""
        connection = self._connection
        payload = self._payload
        if not payload.is_eof() and not connection.can_capture():  # the connection is ending
            self._service.bodies.gate.leave()
            self._failed(ServiceUnavailable())
            return
        try:
            self._body, mapped = self._service.bodies.held(self._size)
        except OSError as exc:  # its place is given back already
            self._failed(
                ServiceUnavailable(
                    f"the runtime has no room for this request's body now ({exc.strerror}); "
                    "try again"
                )
            )
            return
        self._capture = connection.capture_body(payload, mapped, self._size, self._read_whole)
        if self._capture is None:  # it had arrived whole
            self._hand_over()
            return
        capture = self._capture
        left = self._service.bodies.time_left(self._call.deadline)
        connection.watch_body(
            lambda: capture.arriving, self._stalled, lambda: capture.received, self._size, left
        )
        if left is not None:
            self._timer = self._service.loop.call_later(left, self._past_deadline)

    def _read_whole(self) -> None:
        self._stop_timer()
        self._capture = None
        self._hand_over()

    def _hand_over(self) -> None:
        body, self._body = self._body, None
        assert body is not None
        self._ready(body)

    def _stalled(self, exc: BaseException) -> None:
        """No byte for ``--request-head-timeout``: ``408`` (the connection closes)."""
        assert isinstance(exc, HttpError)
        self._stop_timer()
        self._stop_reading(exc)

    def _past_deadline(self) -> None:
        """Still arriving at the request's deadline: ``408`` (the connection closes), and
        the place goes to a body that may yet be answered in time."""
        self._timer = None
        self._stop_reading(self._service.bodies.past_deadline(self._call.caller_budget))

    def _stop_reading(self, exc: HttpError) -> None:
        assert self._capture is not None
        self._capture.give_up()
        self._capture = None
        self._release()
        self._failed(exc)

    def abandon(self) -> None:
        """The client left: nothing is read, nothing held."""
        self._stop_timer()
        if self._turn is not None:
            self._service.bodies.gate.give_up(self._turn)
            self._turn = None
        if self._capture is not None:
            self._capture.give_up()
            self._capture = None
        self._release()

    def _release(self) -> None:
        """Give the place and the buffer back (once), if the call does not own them yet."""
        body, self._body = self._body, None
        if body is not None:
            body.close()
