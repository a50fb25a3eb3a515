"""Every private name of aiohttp the front relies on, in one place (aiohttp 3.14; ``pyproject.toml``
pins it below 3.15 for them).

The front's connection (:class:`~abeja_runtime.front.connection.Connection`) is aiohttp's
``RequestHandler`` with a second way through it, the direct path, which serves a request from
aiohttp's queue of parsed requests without aiohttp's request loop. That needs what aiohttp keeps
to itself: the queue, the future its loop waits on, its flow-control flags, its keep-alive timer,
its parser. No other module names them; they are reached through this one:

* :class:`HandlerInternals`, the base of the connection: aiohttp's private attributes under
  names of the front's (``aio_*``), and methods for what takes several of them. Each attribute
  is aiohttp's own ``__slots__`` descriptor under a second name, so ``self.aio_messages`` costs
  exactly what ``self._messages`` costs: the direct path reads them for every request (about
  24k a second), and a property or a function call there would be a layer per read.
* :func:`whole_body`: a small body that came whole, without ``read_nowait``'s bookkeeping.
* :data:`PRIVATE_NAMES`: all of the above, by aiohttp class or module.
  ``tests/unit/test_aiohttp_private.py`` checks them against the installed aiohttp, so that an
  upgrade fails at once, with the list of what is gone.

An aiohttp that keeps a name but no longer declares it in ``__slots__`` still works (the
attribute is then reached by name, a little slower); the test says so too.
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web, web_protocol
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import HttpRequestParser
from aiohttp.streams import StreamReader

__all__ = [
    "PRIVATE_NAMES",
    "HandlerInternals",
    "whole_body",
]

#: The private names relied on, by where aiohttp 3.14 defines them: a class (an attribute of its
#: instances, or a method) or a module (a module-level name).
PRIVATE_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "aiohttp.base_protocol.BaseProtocol": (
        "_parser",
        "_reading_paused",
        "_buffer_paused",
        "_upgraded",
    ),
    "aiohttp.web_protocol.RequestHandler": (
        "_messages",
        "_waiter",
        "_current_request",
        "_force_close",
        "_msg_queue_resume_size",
        "_next_keepalive_close_time",
        "_keepalive_handle",
        "_process_keepalive",
        "_resume_reading_if_drained",
    ),
    "aiohttp.streams.StreamReader": ("_buffer",),
    # Not underscored, but no documented API either: new in 3.14 with the queue's limit.
    "aiohttp.http.HttpRequestParser": ("message_consumed",),
    "aiohttp.web_protocol": ("MAX_MSG_QUEUE_SIZE",),
}


def _owner_name(owner: type) -> str:
    return f"{owner.__module__}.{owner.__qualname__}"


def _slot(owner: type, name: str) -> Any:
    """aiohttp's own descriptor of ``owner``'s attribute ``name`` (a ``__slots__`` member, as
    fast as the private name itself); where aiohttp no longer declares it so, a property that
    reaches it by name."""
    assert name in PRIVATE_NAMES[_owner_name(owner)], f"{name} is missing from PRIVATE_NAMES"
    for klass in owner.__mro__:
        found = vars(klass).get(name)
        if isinstance(found, types.MemberDescriptorType):
            return found

    def get(self: object) -> Any:
        return getattr(self, name)

    def put(self: object, value: Any) -> None:
        setattr(self, name, value)

    return property(get, put, doc=f"{_owner_name(owner)}.{name}, by name")


_Base: Final = BaseProtocol
_Handler: Final = web_protocol.RequestHandler


class HandlerInternals(web_protocol.RequestHandler):
    """aiohttp's connection handler, with its private state under the front's names.

    The attributes are aiohttp's (read and written as aiohttp does); the methods do what
    aiohttp's own request loop (``RequestHandler.start``) does at the same points, for a request
    the direct path serves instead.
    """

    __slots__ = ("_keepalive_seconds", "_read_size", "_server", "event_loop")

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        keepalive_timeout: float = 3630.0,
        read_bufsize: int = 2**18,
        **kwargs: Any,
    ) -> None:
        """As aiohttp's, keeping what the direct path needs of its arguments itself (not
        through aiohttp's private copies): the event loop (the connection's timers and
        futures), the keep-alive period, the read buffer's size and the server."""
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=keepalive_timeout,
            read_bufsize=read_bufsize,
            **kwargs,
        )
        self.event_loop = loop
        self._keepalive_seconds = keepalive_timeout
        self._read_size = read_bufsize
        self._server = manager

    #: Parsed requests not handled yet, oldest first (``RequestHandler._messages``): each a
    #: ``(RawRequestMessage or a parse error, StreamReader)``. aiohttp's ``data_received``
    #: appends to it; the direct path takes from its head (:meth:`pop_message`).
    aio_messages: deque[tuple[Any, StreamReader]] = _slot(_Handler, "_messages")
    #: The future aiohttp's request loop awaits while the queue is empty
    #: (``RequestHandler._waiter``): ``data_received`` sets it when it queues a request, and
    #: ``force_close`` cancels it. Set (not done): aiohttp is idle. The connection hides it
    #: around aiohttp's ``data_received`` so that aiohttp is not woken for a request the direct
    #: path takes, and sets it itself when the direct path took a request before aiohttp's
    #: loop began (:meth:`wait_as_idle`).
    aio_waiter: asyncio.Future[None] | None = _slot(_Handler, "_waiter")
    #: The request aiohttp's handler is serving, if any (``RequestHandler._current_request``).
    aio_current_request: web.BaseRequest | None = _slot(_Handler, "_current_request")
    #: The connection is closing (``RequestHandler._force_close``, set by ``force_close``):
    #: no request is taken any more.
    aio_force_close: bool = _slot(_Handler, "_force_close")
    #: Reading was paused by flow control (``BaseProtocol._reading_paused``: a request's
    #: payload buffer is full, or ``pause_reading()``); ``resume_reading()`` ends it.
    aio_reading_paused: bool = _slot(_Base, "_reading_paused")
    #: Reading is held because aiohttp's queue of parsed requests is full
    #: (``BaseProtocol._buffer_paused``, at ``MAX_MSG_QUEUE_SIZE``; the parser keeps the rest
    #: of the stream unparsed meanwhile). :meth:`release_queue_hold` ends it. Gone on
    #: aiohttp's main branch.
    aio_buffer_paused: bool = _slot(_Base, "_buffer_paused")
    #: The connection was upgraded (``BaseProtocol._upgraded``): its bytes are no longer HTTP.
    aio_upgraded: bool = _slot(_Base, "_upgraded")

    def pop_message(self) -> None:
        """Take the head of :attr:`aio_messages` as aiohttp's request loop takes one: off the
        queue, a slot freed in the parser's count of requests in flight (``message_consumed``:
        at ``MAX_MSG_QUEUE_SIZE`` it stops parsing), and counted in the server's
        ``requests_count``. Whether to release the queue's hold is the caller's
        (:meth:`release_queue_hold`)."""
        self._messages.popleft()
        parser = self._parser
        if parser is not None:
            parser.message_consumed()
        self._server.requests_count += 1

    def release_queue_hold(self) -> None:
        """Once the queue has drained to aiohttp's low-water mark (``_msg_queue_resume_size``,
        half ``MAX_MSG_QUEUE_SIZE``) while reading is held for it (:attr:`aio_buffer_paused`),
        parse what the parser held back and resume reading, as aiohttp's request loop does
        after each request it takes (``_resume_reading_if_drained``, which calls
        ``data_received(b"")``). Without it a client that pipelines more requests than the
        queue holds, all taken by the direct path, would wait for ever."""
        if self._buffer_paused and len(self._messages) <= self._msg_queue_resume_size:
            self._resume_reading_if_drained()

    async def wait_as_idle(self) -> None:
        """Wait as aiohttp's request loop waits for a request (on :attr:`aio_waiter`): until
        ``data_received`` queues one aiohttp is to serve, or ``force_close`` cancels the wait."""
        self._waiter = self.event_loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def arm_keepalive(self) -> None:
        """Start the keep-alive period after an answer aiohttp did not write, as aiohttp does
        after each of its own: the idle connection is closed ``keepalive_timeout`` from now
        (the timer is ``_keepalive_handle``, the deadline ``_next_keepalive_close_time``, read
        by ``_process_keepalive``, which re-arms itself when fired early)."""
        timeout = self._keepalive_seconds
        if timeout > 0:
            loop = self.event_loop
            self._next_keepalive_close_time = loop.time() + timeout
            if self._keepalive_handle is None:
                self._keepalive_handle = loop.call_at(
                    self._next_keepalive_close_time, self._process_keepalive
                )

    def keepalive_deferred(self) -> bool:
        """Whether the connection is busy in a way aiohttp cannot see, so that its keep-alive
        timer must not close it (:meth:`arm_keepalive` is called again when it is idle)."""
        return False

    def _process_keepalive(self) -> None:
        """aiohttp's keep-alive timer: it closes the connection when aiohttp's loop is idle,
        which it also is while the direct path serves a request (:meth:`keepalive_deferred`)."""
        if self.keepalive_deferred():
            self._keepalive_handle = None
            return
        super()._process_keepalive()

    def replace_parser(self, options: Mapping[str, Any]) -> None:
        """A fresh request parser for the bytes that come next, made as aiohttp makes its own
        (the connection's read buffer size, ``RequestPayloadError`` for a broken body, the
        queue's limit; ``options``: the server's ``max_line_size``, ``max_headers``,
        ``max_field_size``, ``auto_decompress``). For after a body read past the parser, which
        llhttp cannot be told to skip."""
        self._parser = HttpRequestParser(
            self,
            self.event_loop,
            self._read_size,
            payload_exception=web_protocol.RequestPayloadError,
            max_msg_queue_size=web_protocol.MAX_MSG_QUEUE_SIZE,
            **options,
        )

    def open_connections(self) -> int:
        """How many connections the server has open, this one included once it is made."""
        return len(self._server.connections)


def whole_body(payload: StreamReader) -> bytes:
    """The body of a request whose payload is whole (``is_eof()``) and small enough that it
    never paused reading (below the payload's high-water mark), read as the direct path takes
    it, for good: its pieces (``StreamReader._buffer``) joined. ``read_nowait()`` does the same
    through three calls of bookkeeping for later reads (a cursor, chunk splits, flow control)
    that nothing makes: 0.45 µs against 0.18 a request."""
    return b"".join(payload._buffer)
