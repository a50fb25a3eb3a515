"""Every private name of aiohttp the front relies on, in one place (aiohttp 3.14; ``pyproject.toml``
pins it below 3.15 for them).

The direct path serves requests from aiohttp's queue of parsed requests without aiohttp's request
loop. :class:`HandlerInternals`, the base of the front's connection, has what it needs under the
front's names (``aio_*``: aiohttp's own ``__slots__`` descriptors, as fast as the private names)
and does with them what aiohttp's request loop does. Where :func:`missing_names` finds one gone,
the front serves every request through aiohttp's public request handling (``web_server.py``).
"""

from __future__ import annotations

import asyncio
import types
from collections import deque
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web_protocol
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http import HttpRequestParser
from aiohttp.streams import StreamReader
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from aiohttp.web_server import Server

__all__ = ["PRIVATE_NAMES", "HandlerInternals", "missing_names", "whole_body"]

#: The private names relied on, by where aiohttp 3.14 defines them: a class (an attribute of its
#: instances, or a method) or a module.
PRIVATE_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "aiohttp.base_protocol.BaseProtocol": ("_parser", "_buffer_paused"),
    "aiohttp.web_protocol.RequestHandler": ("_messages", "_waiter", "_resume_reading_if_drained"),
    "aiohttp.streams.StreamReader": ("_buffer",),
    # Not underscored, but no documented API either: new in 3.14 with the queue's limit.
    "aiohttp.http.HttpRequestParser": ("message_consumed",),
    "aiohttp.web_protocol": ("MAX_MSG_QUEUE_SIZE",),
}
#: The connection handler's options that are its parser's.
_PARSER_OPTIONS: Final = ("max_line_size", "max_headers", "max_field_size", "auto_decompress")


def _slot(owner: type, name: str) -> Any:
    """aiohttp's own descriptor of ``owner``'s attribute ``name`` (a ``__slots__`` member); where
    aiohttp no longer declares it so, a property that reaches it by name."""
    assert name in PRIVATE_NAMES[f"{owner.__module__}.{owner.__qualname__}"], name
    for klass in owner.__mro__:
        found = vars(klass).get(name)
        if isinstance(found, types.MemberDescriptorType):
            return found
    return property(
        lambda self: getattr(self, name), lambda self, value: setattr(self, name, value)
    )


class HandlerInternals(web_protocol.RequestHandler):
    """aiohttp's connection handler, with the private state the direct path needs under the
    front's names, and what aiohttp's request loop (``RequestHandler.start``) does with it."""

    __slots__ = ("_keepalive_seconds", "_parser_options", "_read_size", "_server", "event_loop")

    def __init__(
        self,
        manager: Server,
        *,
        loop: asyncio.AbstractEventLoop,
        keepalive_timeout: float = 3630.0,
        read_bufsize: int = 2**18,
        **kwargs: Any,
    ) -> None:
        """As aiohttp's, keeping what a fresh parser is made with."""
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
        self._parser_options = {name: kwargs[name] for name in _PARSER_OPTIONS if name in kwargs}

    #: Parsed requests not handled yet, oldest first: ``(RawRequestMessage or a parse error,
    #: StreamReader)``; the direct path takes from its head (:meth:`pop_message`).
    aio_messages: deque[tuple[Any, StreamReader]] = _slot(web_protocol.RequestHandler, "_messages")
    #: The future aiohttp's request loop awaits while the queue is empty (set, not done: aiohttp
    #: is idle); ``data_received`` sets its result when it queues a request.
    aio_waiter: asyncio.Future[None] | None = _slot(web_protocol.RequestHandler, "_waiter")
    #: Reading is held because aiohttp's queue of parsed requests is full (at
    #: ``MAX_MSG_QUEUE_SIZE``); :meth:`release_queue_hold` ends it.
    aio_buffer_paused: bool = _slot(BaseProtocol, "_buffer_paused")

    def pop_message(self) -> None:
        """Take the head of :attr:`aio_messages` as aiohttp's request loop takes one: a slot
        freed in the parser's count of requests in flight, counted in ``requests_count``."""
        self._messages.popleft()
        parser = self._parser
        if parser is not None:
            parser.message_consumed()
        self._server.requests_count += 1

    def release_queue_hold(self) -> None:
        """Once the queue has drained to half ``MAX_MSG_QUEUE_SIZE`` while reading is held for
        it, parse what the parser held back and read again, as aiohttp's request loop does (a
        client pipelining more than the queue holds would otherwise wait for ever)."""
        if self._buffer_paused and len(self._messages) <= web_protocol.MAX_MSG_QUEUE_SIZE // 2:
            self._resume_reading_if_drained()

    async def wait_as_idle(self) -> None:
        """Wait as aiohttp's request loop waits for a request (on :attr:`aio_waiter`)."""
        self._waiter = self.event_loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def replace_parser(self) -> None:
        """A fresh request parser, made as aiohttp makes its own, for after a body read past the
        parser (llhttp cannot be told to skip one)."""
        self._parser = HttpRequestParser(
            self,
            self.event_loop,
            self._read_size,
            payload_exception=web_protocol.RequestPayloadError,
            max_msg_queue_size=web_protocol.MAX_MSG_QUEUE_SIZE,
            **self._parser_options,
        )


def whole_body(payload: StreamReader) -> bytes:
    """The body of a whole payload that never paused reading, taken for good: its pieces joined,
    without the bookkeeping ``read_nowait()`` keeps for later reads."""
    return b"".join(payload._buffer)


def missing_names() -> list[str]:
    """The names of :data:`PRIVATE_NAMES` the installed aiohttp lacks, looked for on a live
    connection handler and stream, and the parser's ``max_msg_queue_size`` argument if it takes
    none. Called in the running event loop."""
    loop = asyncio.get_running_loop()
    handler = web_protocol.RequestHandler(Server(_no_handler), loop=loop)
    owners: dict[str, object] = {
        "aiohttp.base_protocol.BaseProtocol": handler,
        "aiohttp.web_protocol.RequestHandler": handler,
        "aiohttp.streams.StreamReader": StreamReader(handler, 2**16, loop=loop),
        "aiohttp.http.HttpRequestParser": HttpRequestParser,
        "aiohttp.web_protocol": web_protocol,
    }
    missing = [
        f"{owner}.{name}"
        for owner, names in PRIVATE_NAMES.items()
        for name in names
        if not hasattr(owners[owner], name)
    ]
    try:
        HttpRequestParser(handler, loop, 2**16, max_msg_queue_size=1)
    except TypeError:
        missing.append("aiohttp.http.HttpRequestParser(max_msg_queue_size=...)")
    return missing


async def _no_handler(request: BaseRequest) -> StreamResponse:
    raise NotImplementedError  # the probes of missing_names serve nothing
